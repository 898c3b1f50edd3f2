"""TrainSequence: one token sequence a backend trains on, built by the engine from scored steps.

It lives here, not in the engine, so a backend needs only ``rllm.types`` to read its batch.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec

from rllm.types.arrays import FloatArray, TokenArray
from rllm.types.errors import InputError

# How far above 1 the probability mass of a teacher's top-k may sum (float rounding of its logprobs).
TOPK_MASS_SLACK = 1e-3


class TeacherTopK(msgspec.Struct, kw_only=True):
    """A distillation teacher's ``k`` most likely tokens at every position of a TrainSequence,
    flattened row-major as ``[len(input_ids), k]``: row i is the teacher's distribution over token
    i given ``input_ids[:i]`` (its ``k`` ids and their logprobs, most likely first). Row 0, which
    nothing predicts, holds zeros; so may any row outside the loss mask. The top-k distillation
    loss (``rllm.algos.losses.distill``) trains each masked-in row toward these."""

    k: int
    ids: TokenArray
    logprobs: FloatArray


class TrainSequence(msgspec.Struct, kw_only=True):
    """One token sequence to train on (a single-turn step, or merged turns of one segment).

    All arrays align with ``input_ids``: the value at index i concerns token i, which the model
    predicts from ``input_ids[:i]``. ``loss_mask`` is 1 for the completion tokens the policy
    sampled and 0 for prompt, tool-output and observation tokens, which never contribute to the
    loss. ``sampler_logprobs`` are the sampler's logprobs of the completion tokens (0 elsewhere).
    ``images`` are the data URIs of the images whose placeholder tokens appear in ``input_ids``,
    in order: a vision-language backend turns them into the same pixel inputs sampling used.
    ``trainer_logprobs`` are filled in by a backend that computes the policy's own logprobs for
    the loss (same alignment, 0 outside completions; taken before the step's first update), so
    the engine can measure the train/sampler mismatch (``rllm.engine.training.mismatch``); None where the
    backend cannot compute them. ``teacher_topk`` is a distillation teacher's top-k tokens per
    position (:class:`TeacherTopK`, rows aligned the same way), for the top-k distillation loss.
    """

    input_ids: TokenArray
    loss_mask: FloatArray
    advantages: FloatArray
    sampler_logprobs: FloatArray
    group_id: str = ""
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    images: list[str] = msgspec.field(default_factory=list)
    trainer_logprobs: FloatArray | None = None
    # Filled by on-policy distillation with ``distill.loss = "topk"`` (rllm.engine.data.distill).
    teacher_topk: TeacherTopK | None = None


def check_teacher_topk(sequence: TrainSequence, where: str = "sequence") -> TeacherTopK:
    """The sequence's teacher top-k, checked against it (InputError naming ``where`` and the field
    otherwise): present, ``k`` >= 1, ``len(input_ids) * k`` ids and logprobs, and at every row the
    loss trains, distinct ids and finite logprobs <= 0 whose probabilities sum to at most 1."""
    topk = sequence.teacher_topk
    if topk is None:
        raise InputError(
            f"{where}.teacher_topk is missing: the top-k distillation loss needs the teacher's top-k"
        )
    n = len(sequence.input_ids)
    if topk.k < 1:
        raise InputError(f"{where}.teacher_topk.k must be >= 1, got {topk.k}")
    for name in ("ids", "logprobs"):
        if len(getattr(topk, name)) != n * topk.k:
            raise InputError(
                f"{where}.teacher_topk.{name} has {len(getattr(topk, name))} values for {n} tokens x k={topk.k}"
            )
    for i, trained in enumerate(sequence.loss_mask):
        if not trained:
            continue
        ids = topk.ids[i * topk.k : (i + 1) * topk.k]
        values = topk.logprobs[i * topk.k : (i + 1) * topk.k]
        if len(set(ids)) != topk.k:
            raise InputError(f"{where}.teacher_topk.ids row {i} repeats a token: {list(ids)}")
        if not all(math.isfinite(v) and v <= 0.0 for v in values):
            raise InputError(
                f"{where}.teacher_topk.logprobs row {i} is not finite logprobs <= 0: {list(values)}"
            )
        if sum(math.exp(v) for v in values) > 1.0 + TOPK_MASS_SLACK:
            raise InputError(
                f"{where}.teacher_topk.logprobs row {i} sums to a probability above 1: {list(values)}"
            )
    return topk
