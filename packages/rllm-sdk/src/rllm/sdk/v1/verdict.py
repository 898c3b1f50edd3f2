"""Pairwise verification prompts and the parser of their replies (A, B or a tie).

The verifier is asked to end with ``VERDICT: A``, ``VERDICT: B`` or ``VERDICT: TIE``. Models do
not always comply, so the parser also takes a boxed letter or a reply that is nothing but the
letter; anything else is unparsed (``None``), which the tournament scores as a tie and counts.
"""

from __future__ import annotations

import enum
import re

from rllm.sdk.rewards.boxed import extract_boxed


class Verdict(enum.StrEnum):
    """Which of the two shown candidates the verifier judged correct."""

    A = "A"
    B = "B"
    TIE = "TIE"


# "both" and "neither" say the pair cannot be split: a tie.
_WORDS = {"a": Verdict.A, "b": Verdict.B, "tie": Verdict.TIE, "both": Verdict.TIE, "neither": Verdict.TIE}
_MARKED = re.compile(r"verdict\s*[:=]?[\s*_`]*(a|b|tie|both|neither)(?![a-z0-9])", re.IGNORECASE)
_BARE = re.compile(r"^[\s*_`(\[]*(?:solution\s+|candidate\s+)?(a|b|tie)[\s*_`)\].!]*$", re.IGNORECASE)

VERIFY_INSTRUCTION = (
    "Two candidate solutions to the same problem follow. Decide which one is correct. "
    "Check each step; do not prefer a solution for its position or its length. "
    "End your reply with exactly one line: VERDICT: A, VERDICT: B, or VERDICT: TIE "
    "(when both or neither are correct)."
)


def parse_verdict(reply: str | None) -> Verdict | None:
    """The verdict of a verification reply, or None when it names none.

    The last ``VERDICT: X`` line wins (models often think aloud first); then a boxed letter;
    then a reply that is only the letter. Never raises.
    """
    if not isinstance(reply, str):
        return None
    marked = _MARKED.findall(reply)
    if marked:
        return _WORDS[marked[-1].lower()]
    boxed = extract_boxed(reply)
    if boxed is not None:
        word = boxed.strip().strip("*_`()").strip().lower()
        if word in _WORDS:
            return _WORDS[word]
    bare = _BARE.match(reply)
    if bare:
        return _WORDS[bare.group(1).lower()]
    return None


def pairwise_messages(problem: str, first: str, second: str) -> list[dict[str, str]]:
    """The chat messages asking which of two candidates (shown as A then B) is correct."""
    content = (
        f"{VERIFY_INSTRUCTION}\n\n## Problem\n{problem}\n\n## Solution A\n{first}\n\n## Solution B\n{second}"
    )
    return [{"role": "user", "content": content}]
