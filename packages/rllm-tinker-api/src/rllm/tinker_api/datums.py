"""TrainSequence -> a Tinker-API Datum (``tinker.types.Datum`` or Fireworks' native ``Datum``).

Tinker-API datums are shifted: ``model_input`` is tokens[:-1] and every loss input is aligned with
``target_tokens`` = tokens[1:] (position j predicts token j+1). Our TrainSequence aligns values
with the token they concern, so each per-token array drops its first entry.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rllm.algos.config import AlgorithmConfig
from rllm.tinker_api.losses import LossPlan, token_weights
from rllm.types import TrainSequence


def shifted(seq: TrainSequence) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    tokens = np.frombuffer(seq.input_ids, dtype=np.int32).astype(np.int64)
    mask = np.frombuffer(seq.loss_mask, dtype=np.float32)[1:]
    advantages = np.frombuffer(seq.advantages, dtype=np.float32)[1:]
    logprobs = np.frombuffer(seq.sampler_logprobs, dtype=np.float32)[1:]
    return tokens[:-1], tokens[1:], mask, advantages, logprobs


def to_datums(batch: list[TrainSequence], algo: AlgorithmConfig, plan: LossPlan, types: Any) -> list[Any]:
    """Datums for one forward_backward call over ``batch`` (one mini-batch).

    ``types`` is the service SDK's types module (``tinker.types``, ``fireworks.training.sdk.types``):
    both build a Datum from ``ModelInput.from_ints`` and numpy loss inputs the same way.

    Built-in RL losses get ``advantages`` pre-multiplied by mask x aggregation weight, so masked
    tokens contribute nothing and Tinker's token sum equals our aggregated loss. cross_entropy
    gets the same factors as ``weights``. The custom path sends the mask as ``weights`` only;
    rllm.algos' loss (``make_custom_loss(algo, batch)``) aggregates on the client.
    """
    rows = [shifted(seq) for seq in batch]
    scales = token_weights([r[2] for r in rows], algo)
    datums = []
    for (inputs, targets, mask, advantages, logprobs), scale in zip(rows, scales, strict=True):
        if plan.loss_fn == "cross_entropy":
            loss_inputs = {"target_tokens": targets, "weights": scale}
        elif plan.loss_fn == "custom":
            # Only what the service needs: the advantages and sampler logprobs stay on the client,
            # in the custom loss (make_custom_loss), which Fireworks requires.
            loss_inputs = {"target_tokens": targets, "weights": mask.astype(np.float32)}
        else:
            loss_inputs = {
                "target_tokens": targets,
                "logprobs": logprobs.astype(np.float32),
                "advantages": (advantages * scale).astype(np.float32),
            }
        datums.append(
            types.Datum(model_input=types.ModelInput.from_ints(inputs.tolist()), loss_fn_inputs=loss_inputs)
        )
    return datums
