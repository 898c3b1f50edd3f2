"""Our rllm.algos loss as a Tinker-API custom loss (``forward_backward_custom``).

The service computes the per-token logprobs remotely and hands them to this function as torch
tensors with gradient; we pad them to [batch, tokens], run rllm.algos' loss with the sampler
logprobs as the old policy, and the service backpropagates the result on the server.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from rllm.algos.config import AlgorithmConfig
from rllm.algos.losses import compute_policy_loss


def _padded(rows: list[torch.Tensor]) -> torch.Tensor:
    width = max(int(r.shape[0]) for r in rows)
    return torch.stack([torch.nn.functional.pad(r.float(), (0, width - int(r.shape[0]))) for r in rows])


def make_custom_loss(
    algo: AlgorithmConfig,
) -> Callable[[list[Any], list[torch.Tensor]], tuple[torch.Tensor, dict[str, float]]]:
    def loss_fn(data: list[Any], logprobs_list: list[torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        def field(name: str) -> torch.Tensor:
            return _padded([d.loss_fn_inputs[name].to_torch() for d in data])

        logprobs = _padded(list(logprobs_list))
        mask = field("weights")
        sampler = field("logprobs")
        return compute_policy_loss(
            logprobs, sampler, field("advantages"), mask, algo, rollout_logprobs=sampler
        )

    return loss_fn
