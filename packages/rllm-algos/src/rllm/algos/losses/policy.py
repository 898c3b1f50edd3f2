"""Per-token policy-gradient losses. Each returns (loss [batch, tokens], metric tensors).

Every loss takes ``(logprobs, old_logprobs, advantages, mask, config)``; rllm.algos.registry
names them (``AlgorithmConfig.loss``), and a user's loss with the same signature joins them
through ``register_loss`` or the ``rllm.losses`` entry point.

All ratios are pi_theta / pi_old computed from log-probabilities; the log-ratio is clamped to
±20 before exp so a single wildly off-policy token gives a large but finite ratio.
Inputs arrive already checked, with masked positions zeroed (see checks.py).
"""

from __future__ import annotations

import torch

from rllm.algos.config import AlgorithmConfig

LossOut = tuple[torch.Tensor, dict[str, torch.Tensor]]
_LOG_RATIO_LIMIT = 20.0


def _ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    log_ratio = torch.clamp(logprobs - old_logprobs, min=-_LOG_RATIO_LIMIT, max=_LOG_RATIO_LIMIT)
    return torch.exp(log_ratio), log_ratio


def ppo_clip(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: AlgorithmConfig,
    *,
    dual_clip: bool = False,
) -> LossOut:
    """PPO's clipped surrogate with asymmetric bounds [1 - clip_low, 1 + clip_high] ("clip-higher":
    a larger upper bound lets unlikely good tokens grow, which keeps entropy from collapsing).

    With ``dual_clip``, a negative-advantage token's loss is also capped at ``-A * dual_clip_c``,
    so a huge ratio on a bad token cannot produce an unbounded update.
    """
    ratio, _ = _ratio(logprobs, old_logprobs)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - config.clip_low, 1.0 + config.clip_high)
    loss = torch.maximum(unclipped, clipped)
    metrics = {"clip_frac": (clipped > unclipped).to(logprobs.dtype)}
    if dual_clip:
        cap = -advantages * config.dual_clip_c
        negative = advantages < 0
        metrics["clip_frac_lower"] = ((loss > cap) & negative).to(logprobs.dtype)
        loss = torch.where(negative, torch.minimum(loss, cap), loss)
    return loss, metrics


def dual_clip(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: AlgorithmConfig,
) -> LossOut:
    """``ppo_clip`` with the dual clip on negative-advantage tokens (bound ``dual_clip_c``)."""
    return ppo_clip(logprobs, old_logprobs, advantages, mask, config, dual_clip=True)


def gspo(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: AlgorithmConfig,
) -> LossOut:
    """GSPO: clip a sequence-level ratio, the geometric mean of the token ratios.

    The ratio's value is exp(mean over the sequence's trained tokens of log pi/pi_old) for every
    token; its gradient flows through each token's own log-prob (sg[s_i] * pi_t / sg[pi_t]).
    """
    log_ratio = logprobs - old_logprobs
    lengths = mask.sum(dim=-1).clamp(min=1).to(logprobs.dtype)
    seq_log_ratio = (log_ratio * mask).sum(dim=-1) / lengths
    token_log_ratio = logprobs - logprobs.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ratio = torch.exp(torch.clamp(token_log_ratio, max=10.0))
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - config.clip_low, 1.0 + config.clip_high)
    return torch.maximum(unclipped, clipped), {"clip_frac": (clipped > unclipped).to(logprobs.dtype)}


def cispo(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: AlgorithmConfig,
) -> LossOut:
    """CISPO: REINFORCE on log pi weighted by the clipped, gradient-free ratio.

    Unlike PPO, a clipped token still gets a gradient (through log pi), only its weight is bounded.
    """
    ratio, _ = _ratio(logprobs, old_logprobs)
    clipped = torch.clamp(ratio, 1.0 - config.clip_low, 1.0 + config.clip_high)
    loss = -clipped.detach() * advantages * logprobs
    return loss, {"clip_frac": (ratio != clipped).to(logprobs.dtype)}


def importance_sampling(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: AlgorithmConfig,
) -> LossOut:
    """Unclipped importance-weighted policy gradient: -(pi/pi_old) * A."""
    ratio, _ = _ratio(logprobs, old_logprobs)
    return -advantages * ratio, {}


def cross_entropy(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor | None,
    advantages: torch.Tensor | None,
    mask: torch.Tensor,
    config: AlgorithmConfig,
) -> LossOut:
    """Supervised fine-tuning: negative log-likelihood of the trained tokens (advantages unused)."""
    return -logprobs, {}
