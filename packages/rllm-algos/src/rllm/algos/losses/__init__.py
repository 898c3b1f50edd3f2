"""rllm.algos.losses: policy losses, KL penalties and aggregation in torch (the ``torch`` extra).

``compute_policy_loss`` is the one entry point a backend calls per micro-batch.
"""

from __future__ import annotations

import torch

from rllm.algos.config import AlgorithmConfig
from rllm.algos.losses.aggregation import aggregate, masked_mean
from rllm.algos.losses.checks import LossInputError, check_advantages, check_mask, check_tokens
from rllm.algos.losses.kl import kl_penalty
from rllm.algos.losses.tis import tis_weights
from rllm.algos.registry import get_loss

__all__ = [
    "LossInputError",
    "aggregate",
    "compute_policy_loss",
    "kl_penalty",
    "masked_mean",
    "tis_weights",
    "zero_advantage_rows_inert",
]


def zero_advantage_rows_inert(config: AlgorithmConfig) -> bool:
    """Whether, under ``config``, a sequence whose trained tokens all have advantage 0 adds
    nothing to the loss or its gradient beyond its counts in the denominators (``num_tokens`` /
    ``num_sequences``) — so a backend may leave it out of the forward and backward passes and
    still take exactly the update the whole batch gives.

    True when the loss declares it (``LossSpec.inert_at_zero_advantage``), no KL or entropy term
    reaches every token, and the aggregation's scale does not depend on the batch's padded width
    (``seq-mean-token-sum-norm`` without ``loss_scale_factor`` divides by it).
    """
    return (
        get_loss(config.loss).inert_at_zero_advantage
        and config.kl_coef == 0
        and config.entropy_coef == 0
        and not (config.aggregation == "seq-mean-token-sum-norm" and config.loss_scale_factor is None)
    )


def compute_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor | None,
    advantages: torch.Tensor | None,
    mask: torch.Tensor,
    config: AlgorithmConfig,
    *,
    sampler_logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    num_tokens: float | None = None,
    num_sequences: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The scalar training loss for one batch and its metrics.

    Tensors are [batch, tokens] and aligned; ``mask`` is 1 for trained tokens (response tokens
    the policy produced) and 0 for prompt, tool-output/observation tokens and padding, which
    never reach the loss or its gradient. ``advantages`` may also be [batch] (one per sequence).

    - ``old_logprobs``: the trainer's log-probs before this update (the PPO ratio's denominator);
      not needed for ``cross_entropy``.
    - ``sampler_logprobs``: the sampler's log-probs; required when ``config.tis`` is not "none".
      With ``tis = "trust_region"`` they replace ``old_logprobs`` as the ratio's denominator.
    - ``ref_logprobs``: the reference model's; required when ``config.kl_coef > 0``.
    - ``entropy``: per-token entropy, if the backend computed it; reported, and subtracted with
      ``entropy_coef`` as a bonus.
    - ``num_tokens`` / ``num_sequences``: global denominators when the batch is a micro-batch.

    total = aggregate(policy loss [* TIS weight]) + kl_coef * aggregate(KL) - entropy_coef * aggregate(entropy)
    """
    # config was validated when it was built (AlgorithmConfig.__post_init__): not again per micro-batch
    spec = get_loss(config.loss)
    mask = check_mask(mask)
    lp = check_tokens("logprobs", logprobs, mask)
    supervised = spec.supervised
    old = check_tokens("old_logprobs", old_logprobs, mask, required=not supervised or config.tis != "none")
    adv = check_advantages(advantages, mask, required=not supervised)
    sampler = check_tokens("sampler_logprobs", sampler_logprobs, mask, required=config.tis != "none")
    ref = check_tokens("ref_logprobs", ref_logprobs, mask, required=config.kl_coef > 0)
    ent = check_tokens("entropy", entropy, mask, required=config.entropy_coef != 0)
    agg = {
        "loss_scale_factor": config.loss_scale_factor,
        "num_tokens": num_tokens,
        "num_sequences": num_sequences,
    }

    # The ratio's denominator: the policy before this update, or with "trust_region" the one that
    # sampled the tokens, so a stale sample's step is clipped around where it came from (with one
    # update per batch pi_old is the current policy, the ratio is 1 and PPO's clip never acts).
    base = sampler if config.tis == "trust_region" else old
    # the checks above required old log-probs and advantages unless the loss is supervised
    token_loss, token_metrics = spec.load()(lp, base, adv, mask, config)

    metrics: dict[str, float] = {}
    if config.tis == "trust_region":
        assert sampler is not None  # required above when TIS is on
        drift = torch.exp(torch.clamp((lp - sampler).detach(), min=-20.0, max=20.0))
        metrics["tis/ratio_mean"] = masked_mean(drift, mask).item()
    elif config.tis != "none":
        assert old is not None and sampler is not None  # required above when TIS is on
        weights, capped = tis_weights(old, sampler, mask, config.tis, config.tis_cap)
        token_loss = token_loss * weights
        metrics["tis/weight_mean"] = masked_mean(weights, mask).item()
        metrics["tis/capped_frac"] = masked_mean(capped.to(lp.dtype), mask).item()
    policy_loss = aggregate(token_loss, mask, config.aggregation, **agg)
    total = policy_loss
    metrics["policy_loss"] = policy_loss.item()
    for name, value in token_metrics.items():
        metrics[name] = masked_mean(value, mask).item()
    if old is not None and not supervised:
        metrics["approx_kl"] = masked_mean((old - lp).detach(), mask).item()
    if ref is not None:
        kl = kl_penalty(lp, ref, config.kl_estimator)
        kl_loss = aggregate(kl, mask, config.aggregation, **agg)
        metrics["kl"] = masked_mean(kl.detach(), mask).item()
        if config.kl_coef > 0:
            total = total + config.kl_coef * kl_loss
    if ent is not None:
        metrics["entropy"] = masked_mean(ent.detach(), mask).item()
        if config.entropy_coef != 0:
            total = total - config.entropy_coef * aggregate(ent, mask, config.aggregation, **agg)
    metrics["num_tokens"] = float(mask.sum().item())
    metrics["loss"] = total.item()
    if not torch.isfinite(total):
        raise LossInputError(
            f"the loss is not finite ({total.item()}) although every input was; metrics: {metrics}"
        )
    return total, metrics
