"""AlgorithmConfig: every RL algorithm option, validated once, honoured or refused by backends."""

from __future__ import annotations

import math
from typing import Literal

import msgspec

# Raised when an option has a value rLLM cannot honour (the message names the option); one class
# for every config error of the project, re-exported here where users import it from.
from rllm.algos.registry import BUILTIN_LOSSES, get_loss
from rllm.types.errors import ConfigError, InvariantError

Aggregation = Literal[
    "token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"
]

AGGREGATIONS: tuple[str, ...] = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)
# The built-in losses (rllm.algos.registry holds them, and any a user registers).
LOSSES: tuple[str, ...] = BUILTIN_LOSSES
KL_ESTIMATORS: tuple[str, ...] = ("k1", "k2", "k3")
TIS_MODES: tuple[str, ...] = ("none", "token", "sequence", "trust_region")
# The built-in losses that clip their ratio (their own trust region), read off their LossSpecs
# (``clips_ratio``, the one declaration): kept for imports; a plugin loss is not in it, so ask
# ``get_loss(name).clips_ratio``.
TRUST_REGION_LOSSES: tuple[str, ...] = tuple(name for name in BUILTIN_LOSSES if get_loss(name).clips_ratio)
STEP_CREDITS: tuple[str, ...] = ("broadcast", "turn")
# Names accepted in ``mask_terminations``: every TerminationReason value, plus "errors" for both
# error kinds (agent and infrastructure), which users nearly always want to mask together.
ERROR_TERMINATIONS: tuple[str, ...] = ("agent_error", "infra_error")


class DynamicSampling(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``algorithm.dynamic_sampling`` (DAPO's dynamic sampling): keep rolling out groups (one
    task's ``group_size`` rollouts) until the step holds ``tasks_per_step`` groups that carry a
    learning signal (rewards not all equal: the test ``filter_zero_variance`` applies), at most
    ``max_extra_groups`` more than ``tasks_per_step`` (None: ``tasks_per_step`` more). Run by the
    engine's training loops (rllm.engine.training.dynamic_sampling), so every backend honours it;
    the groups without signal stay in the batch unless ``filter_zero_variance`` drops them."""

    enabled: bool = False
    max_extra_groups: int | None = None

    def __post_init__(self) -> None:
        if self.max_extra_groups is not None and self.max_extra_groups < 0:
            raise InvariantError(
                f"max_extra_groups must be >= 0 (None: tasks_per_step), got {self.max_extra_groups}",
                "max_extra_groups",
            )


class AlgorithmConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Advantage estimation, filtering and policy-loss options.

    (Owned by rllm-algos; the Trainer validates it and every backend either honours each option
    or refuses it in ``Backend.validate``.)
    """

    # advantages
    estimator: str = "grpo"  # grpo | drgrpo | rloo | reinforce | reinforce_pp_baseline | batch_norm | turn
    estimator_by_role: dict[str, str] = msgspec.field(default_factory=dict)
    step_credit: Literal["broadcast", "turn"] = "broadcast"
    gamma: float = 1.0
    # Added to the group std (GRPO) so a near-constant group does not blow up its advantages.
    epsilon: float = 1e-6
    # filters
    # Drop groups whose rewards are all equal (DAPO-style). Off by default, as in TRL, verl and
    # tinker-cookbook: dropping them changes the update (the token-mean loses their tokens; a step
    # where every group is dropped takes no optimizer step, so Adam's momentum stalls) and learns
    # slower on sparse rewards (benchmarks/history/issue-35.md, "#35 round 10 — steps to 0.9" and
    # "#35 round 11"). With several updates a batch the local backend leaves zero-advantage
    # sequences out of the updates' passes and still takes exactly the whole batch's update.
    filter_zero_variance: bool = False
    # Roll out more groups until the batch holds tasks_per_step with a learning signal (DAPO).
    dynamic_sampling: DynamicSampling = msgspec.field(default_factory=DynamicSampling)
    min_group_size: int = 1
    mask_terminations: list[str] = msgspec.field(default_factory=list)
    # policy loss
    loss: str = "ppo_clip"  # ppo_clip | dual_clip | gspo | cispo | importance_sampling | cross_entropy
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip_c: float = 3.0
    aggregation: Aggregation = "token-mean"
    # Constant divisor of "seq-mean-token-sum-norm" (Dr.GRPO's max response length). None: the
    # token width of the batch, which changes with padding; set it for a stable loss scale.
    loss_scale_factor: float | None = None
    kl_coef: float = 0.0
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    entropy_coef: float = 0.0
    # Off-policy correction, for sampler/trainer drift and for stale samples (rollout.max_staleness):
    # "token" / "sequence" weight each token's loss by pi_old / pi_sampler (per token, or the
    # sequence's product), capped at ``tis_cap``; "trust_region" takes the loss's own ratio
    # against the sampler's policy, pi_theta / pi_sampler, so its clip bounds the step from the
    # policy that sampled the tokens (as Tinker's and prime-rl's losses do), not from pi_old.
    tis: Literal["none", "token", "sequence", "trust_region"] = "none"
    tis_cap: float = 2.0
    # Token truth: stop the run when a step's mean |trainer - sampler| logprob over sampled tokens
    # exceeds this (nats; e.g. 0.05). None: measured and logged, never enforced. Needs a backend
    # that computes the policy's logprobs (the local tinker backend); others refuse it in validate.
    max_mismatch: float | None = None

    def __post_init__(self) -> None:
        # Checked once, when the config is built or decoded: filters, advantages and the loss
        # trust it and never check it again per step or micro-batch.
        self.validate()

    def validate(self) -> AlgorithmConfig:
        """Raise ConfigError naming the first option that cannot work; return self when all can.

        Runs when the config is built (``__post_init__``). Estimator and loss names are checked
        against the registries, entry points included: register a custom one in-process before
        building the config that names it.
        """
        from rllm.algos.registry import available_estimators, available_losses, ratio_clipping_losses

        known = available_estimators()
        if self.estimator not in known:
            raise ConfigError(
                f"unknown estimator {self.estimator!r} (option `estimator`); known: {', '.join(sorted(known))}"
            )
        for role, name in self.estimator_by_role.items():
            if name not in known:
                raise ConfigError(
                    f"unknown estimator {name!r} for role {role!r} (option `estimator_by_role`); known: {', '.join(sorted(known))}"
                )
        _one_of("step_credit", self.step_credit, STEP_CREDITS)
        losses = available_losses()
        if self.loss not in losses:
            raise ConfigError(f"unknown value {self.loss!r} for `loss`; known: {', '.join(sorted(losses))}")
        _one_of("aggregation", self.aggregation, AGGREGATIONS)
        _one_of("kl_estimator", self.kl_estimator, KL_ESTIMATORS)
        _one_of("tis", self.tis, TIS_MODES)
        from rllm.types import TerminationReason

        allowed = {r.value for r in TerminationReason} | {"errors"}
        for reason in self.mask_terminations:
            if reason not in allowed:
                raise ConfigError(
                    f"unknown termination reason {reason!r} in `mask_terminations`; known: {', '.join(sorted(allowed))}"
                )
        if not (0.0 <= self.gamma <= 1.0):
            raise ConfigError(f"`gamma` must be in [0, 1], got {self.gamma}")
        if self.min_group_size < 1:
            raise ConfigError(f"`min_group_size` must be >= 1, got {self.min_group_size}")
        _positive_finite("epsilon", self.epsilon)
        if not (0.0 <= self.clip_low < 1.0):
            raise ConfigError(
                f"`clip_low` must be in [0, 1) so the lower ratio bound stays positive, got {self.clip_low}"
            )
        if not (self.clip_high >= 0.0 and math.isfinite(self.clip_high)):
            raise ConfigError(f"`clip_high` must be a finite number >= 0, got {self.clip_high}")
        if not (self.dual_clip_c > 1.0 and math.isfinite(self.dual_clip_c)):
            raise ConfigError(f"`dual_clip_c` must be a finite number > 1, got {self.dual_clip_c}")
        if self.loss_scale_factor is not None:
            _positive_finite("loss_scale_factor", self.loss_scale_factor)
        for name in ("kl_coef", "entropy_coef"):
            value = getattr(self, name)
            if not math.isfinite(value):
                raise ConfigError(f"`{name}` must be finite, got {value}")
        if self.kl_coef < 0:
            raise ConfigError(f"`kl_coef` must be >= 0, got {self.kl_coef}")
        if not (self.tis_cap >= 1.0 and math.isfinite(self.tis_cap)):
            raise ConfigError(f"`tis_cap` must be a finite number >= 1, got {self.tis_cap}")
        if self.max_mismatch is not None:
            _positive_finite("max_mismatch", self.max_mismatch)
        if get_loss(self.loss).teacher_topk:
            for name in ("kl_coef", "entropy_coef"):
                if getattr(self, name) != 0:
                    raise ConfigError(
                        f"`{name}` is not applied with loss={self.loss!r} (it trains toward the teacher's "
                        f"top-k alone); set {name}=0"
                    )
        if self.tis != "none" and get_loss(self.loss).supervised:
            raise ConfigError(
                f"`tis` corrects policy-gradient losses for sampler drift; set tis='none' with loss={self.loss!r}"
            )
        if self.tis == "trust_region" and not get_loss(self.loss).clips_ratio:
            raise ConfigError(
                f"`tis`='trust_region' clips the loss's ratio around the sampler's policy, but loss "
                f"{self.loss!r} does not declare that it clips one (LossSpec.clips_ratio); use one "
                f"of {ratio_clipping_losses()} or tis='token'"
            )
        return self

    def estimator_for(self, role: str) -> str:
        """The estimator name for trajectories of ``role`` (per-role map first, then the default)."""
        return self.estimator_by_role.get(role, self.estimator)

    def masked_termination_reasons(self) -> frozenset[str]:
        """``mask_terminations`` with the "errors" alias expanded to concrete TerminationReason values."""
        out = set(self.mask_terminations)
        if "errors" in out:
            out.discard("errors")
            out.update(ERROR_TERMINATIONS)
        return frozenset(out)


def _one_of(option: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"unknown value {value!r} for `{option}`; known: {list(allowed)}")


def _positive_finite(option: str, value: float) -> None:
    if not (value > 0 and math.isfinite(value)):
        raise ConfigError(f"`{option}` must be a finite number > 0, got {value}")
