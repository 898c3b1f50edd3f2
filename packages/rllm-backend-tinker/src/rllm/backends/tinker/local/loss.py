"""The one place the backend calls rllm.algos' policy loss (so its signature is adapted once)."""

from __future__ import annotations

import torch

from rllm.algos.config import AlgorithmConfig


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    algo: AlgorithmConfig,
    *,
    sampler_logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    num_tokens: float | None = None,
    num_sequences: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Scalar loss + metrics for [batch, tokens] tensors (mask 1 = trained token).

    ``sampler_logprobs`` are the logprobs the sampler reported (for truncated importance sampling,
    ``algo.tis``); ``old_logprobs`` those of the policy before this batch's first update.
    ``num_tokens`` / ``num_sequences`` are the whole mini-batch's counts, so the losses of its
    micro-batches add up to the mini-batch's loss (gradient accumulation).
    """
    from rllm.algos.losses import compute_policy_loss

    return compute_policy_loss(
        logprobs,
        old_logprobs,
        advantages,
        mask,
        algo,
        sampler_logprobs=sampler_logprobs,
        ref_logprobs=ref_logprobs,
        entropy=entropy,
        num_tokens=num_tokens,
        num_sequences=num_sequences,
    )
