"""TrainSequence: one token sequence a backend trains on, built by the engine from scored steps.

It lives here, not in the engine, so a backend needs only ``rllm.types`` to read its batch.
"""

from __future__ import annotations

from typing import Any

import msgspec

from rllm.types.arrays import FloatArray, TokenArray


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
    the engine can measure the train/sampler mismatch (``rllm.engine.mismatch``); None where the
    backend cannot compute them.
    """

    input_ids: TokenArray
    loss_mask: FloatArray
    advantages: FloatArray
    sampler_logprobs: FloatArray
    group_id: str = ""
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    images: list[str] = msgspec.field(default_factory=list)
    trainer_logprobs: FloatArray | None = None
