"""Our rllm.algos loss as a Tinker-API custom loss (``forward_backward_custom``).

The service computes the per-token logprobs remotely and hands them to this function as torch
tensors with gradient; we pad them to [batch, tokens], run rllm.algos' loss with the sampler
logprobs as the old policy, and the service backpropagates the result on the server. The
advantages and sampler logprobs come from the batch itself, not from the datums: Fireworks'
``forward_backward_custom`` accepts datums with ``target_tokens`` and ``weights`` only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from rllm.algos.config import AlgorithmConfig
from rllm.algos.losses import compute_policy_loss
from rllm.tinker_api.datums import shifted
from rllm.types import TrainSequence
from rllm.types.errors import InputError


def _padded(rows: list[torch.Tensor]) -> torch.Tensor:
    width = max(int(r.shape[0]) for r in rows)
    return torch.stack([torch.nn.functional.pad(r.float(), (0, width - int(r.shape[0]))) for r in rows])


def _tensors(rows: list[np.ndarray]) -> torch.Tensor:
    return _padded([torch.from_numpy(r.astype(np.float32)) for r in rows])


def make_custom_loss(
    algo: AlgorithmConfig, batch: list[TrainSequence]
) -> Callable[[list[Any], list[torch.Tensor]], tuple[torch.Tensor, dict[str, float]]]:
    """The loss over ``batch``, in the order its datums were built (``to_datums``)."""
    rows = [shifted(seq) for seq in batch]
    mask = _tensors([r[2] for r in rows])
    advantages = _tensors([r[3] for r in rows])
    sampler = _tensors([r[4] for r in rows])

    def loss_fn(data: list[Any], logprobs_list: list[torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        if len(logprobs_list) != len(rows):
            raise InputError(f"the custom loss got {len(logprobs_list)} sequences for a batch of {len(rows)}")
        logprobs = _padded(list(logprobs_list))
        return compute_policy_loss(logprobs, sampler, advantages, mask, algo, sampler_logprobs=sampler)

    return loss_fn
