"""The teacher's top-k per position for dense distillation (``distill.loss = "topk"``): a strict
parser of vLLM's ``prompt_logprobs: k`` (the config rule that picks the loss is
``rllm.engine.data.distill.check_distill_loss``).

vLLM's format (also the local sampler's and ``rllm serve``'s): ``prompt_logprobs`` is a list with
one entry per prompt token; the first is None (nothing predicts it), every other a dict
``{"<token id>": {"logprob": float, "rank": int | None, "decoded_token": str}}`` holding the ``k``
most likely tokens at that position plus the prompt's own token when it is not among them (so
``k`` or ``k + 1`` entries). Anything else is an InputError naming the position and the field,
never a zero: a silent zero would train the student toward a teacher that said nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from rllm.types.arrays import FloatArray, TokenArray
from rllm.types.errors import InputError
from rllm.types.sequence import TeacherTopK


def parse_prompt_logprobs(
    scores: Any, input_ids: Sequence[int], k: int = 0, where: str = "prompt_logprobs"
) -> tuple[list[float], TeacherTopK | None]:
    """Each token's teacher logprob (0.0 for the first) and, when ``k`` > 0, the teacher's top-k
    at every position (row 0 zeros), from one prompt's ``prompt_logprobs``. InputError naming
    ``where[position]`` for any entry that does not fit."""
    n = len(input_ids)
    if not isinstance(scores, list):
        raise InputError(
            f"{where} is missing ({type(scores).__name__}): the teacher returned no prompt_logprobs"
        )
    if len(scores) != n:
        raise InputError(f"{where} has {len(scores)} positions for the {n} tokens sent")
    own: list[float] = [0.0]
    ids: list[int] = [0] * k
    values: list[float] = [0.0] * k
    for position in range(1, n):
        entry, ranks = _entry(scores[position], f"{where}[{position}]")
        token = int(input_ids[position])
        if token not in entry:
            raise InputError(f"{where}[{position}] has no logprob for the prompt's token {token}")
        own.append(entry[token])
        if k:
            if not k <= len(entry) <= k + 1:
                raise InputError(
                    f"{where}[{position}] has {len(entry)} tokens, expected the top {k} (and the prompt's "
                    f"own token when outside them): does the teacher honour prompt_logprobs={k}?"
                )
            top = sorted(entry.items(), key=lambda item: (-item[1], item[0]))[:k]
            outside = [t for t, _ in top if ranks.get(t, 0) > k]
            if outside:  # e.g. a server that ignored k and sent the prompt's token alone
                raise InputError(
                    f"{where}[{position}] puts token {outside[0]} (rank {ranks[outside[0]]}) among the top {k}"
                )
            ids.extend(t for t, _ in top)
            values.extend(v for _, v in top)
    if not k:
        return own, None
    return own, TeacherTopK(k=k, ids=TokenArray(ids), logprobs=FloatArray(values))


def _entry(raw: Any, where: str) -> tuple[dict[int, float], dict[int, int]]:
    """One position's ``{token id: logprob}`` and the ranks it reports, every key and value checked."""
    if not isinstance(raw, dict) or not raw:
        raise InputError(f"{where} must be a non-empty {{token id: {{logprob, ...}}}} dict, got {raw!r:.80}")
    out: dict[int, float] = {}
    ranks: dict[int, int] = {}
    for key, item in raw.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise InputError(f"{where} has a key {key!r} that is not a token id") from None
        if token < 0 or (isinstance(key, str) and key != str(token)):
            raise InputError(f"{where} has a key {key!r} that is not a token id")
        value = item.get("logprob") if isinstance(item, dict) else None
        if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
            raise InputError(f"{where}[{key!r}].logprob must be a finite number, got {value!r}")
        if value > 1e-4:
            raise InputError(f"{where}[{key!r}].logprob is {value}, above 0: not a logprob")
        out[token] = min(float(value), 0.0)
        rank = item.get("rank")
        if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool) or rank < 1):
            raise InputError(f"{where}[{key!r}].rank must be an integer >= 1 or null, got {rank!r}")
        if rank is not None:
            ranks[token] = rank
    return out, ranks


__all__ = ["parse_prompt_logprobs"]
