"""Truncated importance sampling (TIS) for the rollout-vs-trainer logprob mismatch.

The sampler (vLLM, SGLang, ...) and the trainer compute slightly different probabilities for the
same tokens, so the rollout is off-policy even at step 0. Each token's loss is re-weighted by
pi_trainer_old / pi_sampler, capped at ``cap`` so a few outliers cannot blow up the update. The
weight carries no gradient.
"""

from __future__ import annotations

import torch

from rllm.types.errors import InputError


def tis_weights(
    old_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor, mode: str, cap: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [batch, tokens], capped [batch, tokens] bool) for mode "token" or "sequence".

    "sequence" uses one weight per sequence: the product of its tokens' ratios (the exact
    sequence likelihood ratio), capped.
    """
    log_ratio = (old_logprobs - sampler_logprobs).detach()
    log_ratio = torch.where(mask, log_ratio, torch.zeros_like(log_ratio))
    if mode == "token":
        raw = torch.exp(torch.clamp(log_ratio, min=-20.0, max=20.0))
    elif mode == "sequence":
        seq = torch.clamp(log_ratio.sum(dim=-1, keepdim=True), min=-20.0, max=20.0)
        raw = torch.exp(seq).expand_as(log_ratio)
    else:
        raise InputError(f"unknown TIS mode {mode!r}; known: ['token', 'sequence']")
    return torch.clamp(raw, max=cap), raw > cap
