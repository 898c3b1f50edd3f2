"""Which Tinker-API loss runs an AlgorithmConfig, and which algorithm options such a service refuses.

Tinker's built-in losses take per-token advantages and sum over tokens, and each is linear in the
advantage per token. So our aggregation (token-mean, seq-mean-..., see rllm.algos) is honoured
exactly by scaling each token's advantage by its aggregation weight (``token_weights``).
Which built-in runs a loss is the loss's own declaration in the rllm.algos registry
(``LossSpec.tinker_loss``, and ``clips_ratio`` for the clip thresholds it is given); a loss with
no built-in twin (dual_clip, a plugin that declares none) runs our own rllm.algos loss
client-side through ``forward_backward_custom``.

The remote service's "old" policy is the sampler (Tinker's convention: the datum's ``logprobs``
are the sampling logprobs), so it cannot also correct trainer/sampler drift (``tis`` token or
sequence; ``tis = "trust_region"`` is that convention itself, so it is honoured), has no
reference model for ``kl_coef`` and no per-token entropy for ``entropy_coef``: those are refused.
Each backend adds the refusals of its own config (LoRA shape, batching) to these.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rllm.algos import registry
from rllm.algos.config import AlgorithmConfig
from rllm.algos.registry import get_loss

# The built-in losses with a Tinker twin: our name -> Tinker's built-in loss_fn, read off their
# LossSpecs (``tinker_loss``). Kept for imports; plan_loss asks the registry, so plugins count.
BUILTIN_LOSSES: dict[str, str] = {
    name: spec.tinker_loss for name in registry.BUILTIN_LOSSES if (spec := get_loss(name)).tinker_loss
}


@dataclass(frozen=True)
class LossPlan:
    """``loss_fn`` is a Tinker built-in name, or "custom" for forward_backward_custom."""

    loss_fn: str
    loss_fn_config: dict[str, float] | None


def unsupported_algo_options(algo: AlgorithmConfig, service: str) -> list[str]:
    """One line per AlgorithmConfig option a Tinker-API ``service`` cannot honour, naming it."""
    problems = []
    if get_loss(algo.loss).teacher_topk:
        problems.append(
            f"`loss` = {algo.loss!r} (distill.loss=topk): {service} computes logprobs of the sampled "
            "tokens only, not the student's logprobs of the teacher's top-k; set distill.loss=sampled"
        )
    if algo.kl_coef > 0:
        problems.append(f"`kl_coef` > 0: {service} has no reference-model logprobs; set kl_coef=0")
    if algo.entropy_coef != 0:
        problems.append(
            f"`entropy_coef` != 0: {service} returns logprobs only, not the entropy; set entropy_coef=0"
        )
    # "trust_region" is this service's own convention (the ratio against the sampler's policy).
    if algo.tis not in ("none", "trust_region"):
        problems.append(
            f"`tis`: {service} uses the sampler's logprobs as the old policy, so there is no "
            "trainer/sampler mismatch to correct; set tis='none'"
        )
    if algo.max_mismatch is not None:
        problems.append(
            f"`max_mismatch`: {service} does not return the trainer's logprobs to this backend, so the "
            "train/sampler mismatch cannot be measured; leave max_mismatch unset"
        )
    return problems


def plan_loss(algo: AlgorithmConfig) -> LossPlan:
    """The Tinker built-in that ``algo.loss`` declares (``LossSpec.tinker_loss``), with the clip
    thresholds when it clips its ratio; "custom" when it declares none."""
    spec = get_loss(algo.loss)
    if not spec.tinker_loss:
        return LossPlan("custom", None)
    if spec.clips_ratio:
        return LossPlan(
            spec.tinker_loss,
            {"clip_low_threshold": 1.0 - algo.clip_low, "clip_high_threshold": 1.0 + algo.clip_high},
        )
    return LossPlan(spec.tinker_loss, None)


def token_weights(masks: list[np.ndarray], algo: AlgorithmConfig) -> list[np.ndarray]:
    """Per-token factors that turn Tinker's token sum into ``algo.aggregation`` over this batch.

    Sequences without a trained token are not counted (as in rllm.algos.losses.aggregate).
    """
    counts = [float(m.sum()) for m in masks]
    total_tokens = sum(counts)
    sequences = float(sum(1 for c in counts if c > 0))
    width = max(len(m) for m in masks)
    out = []
    for mask, count in zip(masks, counts, strict=True):
        if algo.aggregation == "token-mean":
            scale = 1.0 / total_tokens if total_tokens else 0.0
        elif algo.aggregation == "token-sum":
            scale = 1.0
        elif algo.aggregation == "seq-mean-token-sum":
            scale = 1.0 / sequences if sequences else 0.0
        elif algo.aggregation == "seq-mean-token-mean":
            scale = 1.0 / (sequences * count) if count else 0.0
        else:  # seq-mean-token-sum-norm
            norm = algo.loss_scale_factor if algo.loss_scale_factor is not None else float(width)
            scale = 1.0 / (sequences * norm) if sequences else 0.0
        out.append((mask * scale).astype(np.float32))
    return out
