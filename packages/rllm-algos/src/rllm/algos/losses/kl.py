"""Per-token KL estimators between the policy and a reference (J. Schulman's k1/k2/k3).

k1 = log p - log q (unbiased, high variance, can be negative); k2 = (log p - log q)^2 / 2;
k3 = q/p - 1 - log(q/p) (unbiased, low variance, never negative). k3's log-ratio and value are
clamped (±20 and [-10, 10]) so one extreme token cannot dominate the batch.
"""

from __future__ import annotations

import torch

from rllm.types.errors import InputError


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) with estimator k1, k2 or k3."""
    diff = logprobs - ref_logprobs
    if estimator == "k1":
        return diff
    if estimator == "k2":
        return 0.5 * diff.square()
    if estimator == "k3":
        log_ratio = torch.clamp(-diff, min=-20.0, max=20.0)
        return torch.clamp(torch.exp(log_ratio) - log_ratio - 1.0, min=-10.0, max=10.0)
    raise InputError(f"unknown KL estimator {estimator!r}; known: ['k1', 'k2', 'k3']")
