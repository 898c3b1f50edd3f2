"""Strict parsers of rubric judges' replies: a reply is accepted whole or refused with the reason.

Both formats are integer scores on ``0..scale`` (reward = score / scale), written so that a
word-level tokenizer's spacing ("SCORE 1 : 7") still reads the same:

- pointwise (``RubricJudge``): exactly one ``SCORE: s`` anywhere in the reply;
- group (``GroupJudge``, RULER-style relative scores): exactly one ``SCORE i: s`` for every
  trajectory ``i`` in ``1..n`` (any order, any text around them).

Anything else is refused (a ``JudgeParseError``, a ValueError): no score, two scores, a decimal
or negative score, one over the scale, a missing, repeated or unknown trajectory number. A reply
refused is never a score of 0: the endpoint turns it into an infrastructure error.
"""

from __future__ import annotations

import re

from rllm.types.errors import RLLMError

# A number after the colon, decimals and signs included, so that "7.5" or "-1" is refused by
# name instead of being read as "7" or ignored; spaces (not line breaks) may stand around the
# point, as a word-level tokenizer decodes it ("7 . 5"): the next line is never part of it.
_NUMBER = r"([-+]?\d+(?:[ \t]*\.[ \t]*\d+)?)"
_POINTWISE = re.compile(r"(?<![A-Za-z0-9_])SCORE\s*:\s*" + _NUMBER, re.IGNORECASE)
_GROUP = re.compile(r"(?<![A-Za-z0-9_])SCORE\s+([-+]?\d+)\s*:\s*" + _NUMBER, re.IGNORECASE)


class JudgeParseError(RLLMError, ValueError):
    """A judge reply that is not in the format its prompt asked for."""


def _score(text: str, scale: int, where: str) -> int:
    compact = re.sub(r"\s+", "", text)
    if not re.fullmatch(r"\d+", compact):
        raise JudgeParseError(f"{where} {compact!r} is not a whole number from 0 to {scale}")
    value = int(compact)
    if value > scale:
        raise JudgeParseError(f"{where} {value} is over the scale's maximum {scale}")
    return value


def parse_rubric_score(reply: str, scale: int = 10) -> int:
    """The one ``SCORE: s`` of a pointwise rubric judge's reply, ``0 <= s <= scale``."""
    if scale < 1:
        raise JudgeParseError(f"a rubric scale must be >= 1, got {scale}")
    found = _POINTWISE.findall(reply)
    if not found:
        raise JudgeParseError(f"no 'SCORE: s' line (s a whole number from 0 to {scale})")
    if len(found) > 1:
        raise JudgeParseError(f"{len(found)} 'SCORE:' lines, expected exactly one")
    return _score(found[0], scale, "SCORE")


def parse_group_scores(reply: str, n: int, scale: int = 10) -> list[int]:
    """Trajectory ``1..n``'s scores (list index 0 is trajectory 1) from a group judge's reply."""
    if n < 1:
        raise JudgeParseError(f"a group has at least one trajectory, got {n}")
    if scale < 1:
        raise JudgeParseError(f"a rubric scale must be >= 1, got {scale}")
    scores: dict[int, int] = {}
    for number, value in _GROUP.findall(reply):
        index = int(number)
        if not 1 <= index <= n:
            raise JudgeParseError(f"'SCORE {index}:' names no trajectory (there are {n}, numbered 1..{n})")
        if index in scores:
            raise JudgeParseError(f"trajectory {index} is scored twice")
        scores[index] = _score(value, scale, f"SCORE {index}:")
    missing = [i for i in range(1, n + 1) if i not in scores]
    if missing:
        raise JudgeParseError(f"no 'SCORE i: s' line for trajectory {', '.join(map(str, missing))} of {n}")
    return [scores[i] for i in range(1, n + 1)]
