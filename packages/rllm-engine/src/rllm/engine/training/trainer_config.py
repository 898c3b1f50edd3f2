"""TrainerConfig: one typed config for a training run, from TOML/YAML/JSON plus `a.b=value` overrides.

Validated up front: an unknown key, a mistyped value or an algorithm option the chosen backend
cannot honour stops the run before anything starts, with the key's dotted path in the message.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import msgspec

from rllm.algos.config import AlgorithmConfig
from rllm.engine.data.distill import DistillSection, check_distill_loss
from rllm.engine.rollout.executors import get_executor, resolve_executor
from rllm.engine.rollout.rollout_config import RolloutConfig
from rllm.engine.training.checkpoint import KEEP_CHECKPOINTS
from rllm.engine.training.health_config import HealthSection
from rllm.engine.training.policies import PolicySection, check_policies
from rllm.engine.training.seeding import seeded
from rllm.engine.training.staleness import (
    TrainRolloutSettings,
    check_correction,
    default_correction,
    engine_settings,
)
from rllm.types import ConfigError
from rllm.types.config_file import apply_overrides, convert_config, merge_config, read_config_file
from rllm.types.errors import LookupFailed

# The trainer's own rollout defaults, kept apart from RolloutEngine's on purpose: a training step
# waits for its slowest rollout, so a stuck one is cut off sooner (120 s of being stalled, not
# 600 s; time queued behind the batch at a shared sampler does not count) and retried
# once, not twice; rollouts sample from the policy itself (temperature 1) and validation is
# greedy (temperature 0). Any key a config gives replaces its default here (``rollout.sampling``
# as a whole, as for every other key of the section).
TRAINING_ROLLOUT_DEFAULTS: dict[str, Any] = {
    "deadline_s": 120.0,
    "max_retries": 1,
    "sampling": {"temperature": 1.0},
    "val_sampling": {"temperature": 0.0},
}


# RolloutConfig's own keys, which a training config does not have: the trainer decides them.
TRAINER_DECIDES: dict[str, str] = {
    "n": "set `group_size` (rollouts per task)",
    "model": "agents get the backend's served model name",
    "progress": "set `progress` (the trainer's own display)",
}


def training_rollout(**settings: Any) -> TrainRolloutSettings:
    """A training config's ``rollout`` section: the trainer's defaults, then ``settings``."""
    return convert_config({**copy.deepcopy(TRAINING_ROLLOUT_DEFAULTS), **settings}, TrainRolloutSettings)


class BackendSection(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: str = "tinker"
    options: dict[str, Any] = msgspec.field(default_factory=dict)  # the backend's own typed config


# Keys that moved out of the ``rollout`` section: refused there, naming their new place.
MOVED_FROM_ROLLOUT: dict[str, str] = {"sandbox_allow_task_network": "sandbox.allow_task_network"}


class SandboxSection(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``sandbox.*``: the operator's decisions about sandboxes. ``allow_task_network``: consent to
    tasks whose own data asks for the network (a task directory's ``network = true``); without it
    such a run is refused before any rollout starts."""

    allow_task_network: bool = False


class GatewaySection(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    mode: Literal["plain", "cumulative"] = "cumulative"
    store: str = "memory"


class TrainerConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    cookbook: str
    # The cookbook's own settings (its Cookbook.configure reads them), e.g. FinQA's judge.
    cookbook_options: dict[str, Any] = msgspec.field(default_factory=dict)
    seed: int = 0
    total_steps: int = 100
    tasks_per_step: int = 8
    group_size: int = 8
    train_split: str = "train"
    val_split: str | None = None
    val_every: int = 0
    val_tasks: int | None = None
    ckpt_every: int = 0
    # The newest checkpoints kept in OUT/checkpoints/; each older one removed is said in the output.
    keep_checkpoints: int = KEEP_CHECKPOINTS
    # Start from another run's checkpoint (RUN/checkpoints/step_N, or RUN for its latest): rllm.engine.training.init_from.
    init_from: str | None = None
    out_dir: str = "runs/default"
    tensorboard: bool = True
    wandb: bool = False
    plot: bool = True
    progress: bool = True
    # Groups (tasks, with all their rollouts) per step saved to OUT/samples/ for `rllm view`; 0: none.
    sample_groups: int = 2
    algorithm: AlgorithmConfig = msgspec.field(default_factory=AlgorithmConfig)
    rollout: TrainRolloutSettings = msgspec.field(default_factory=training_rollout)
    backend: BackendSection = msgspec.field(default_factory=BackendSection)
    gateway: GatewaySection = msgspec.field(default_factory=GatewaySection)
    sandbox: SandboxSection = msgspec.field(default_factory=SandboxSection)
    # On-policy distillation (`rllm distill`): a teacher's per-token advantages (rllm.engine.data.distill).
    distill: DistillSection | None = None
    # Training-health checks run every step (rllm.engine.training.health).
    health: HealthSection = msgspec.field(default_factory=HealthSection)
    # Several policies on one base model, one LoRA adapter each, and the policy each agent role
    # trains (unmapped roles: the default policy, the run's own): rllm.engine.training.policies.
    policies: dict[str, PolicySection] = msgspec.field(default_factory=dict)
    roles: dict[str, str] = msgspec.field(default_factory=dict)

    def engine_rollout(self, model: str) -> RolloutConfig:
        """The RolloutConfig of this run's engine: the ``rollout`` settings, the backend's served
        ``model`` name, and no engine progress bar (the trainer draws its own).

        Where flows run in this process, sampling is seeded from ``seed`` unless the config seeds
        it (rllm.engine.training.seeding; each step then moves the seed on). Flow processes keep
        the sampling they were started with for the whole run, so there a default seed would give
        a task's rollouts the same random draws in every epoch: they sample unseeded."""
        settings = engine_settings(self.rollout)
        if self.flows_in_process():
            settings["sampling"] = seeded(self.rollout.sampling, self.seed)
            settings["val_sampling"] = seeded(self.rollout.val_sampling, self.seed)
        return RolloutConfig(
            **settings,
            model=model,
            progress=False,
            sandbox_allow_task_network=self.sandbox.allow_task_network,
        )

    def flows_in_process(self) -> bool:
        """Whether the engine runs every rollout from the trainer's process (no worker pool)."""
        try:
            return get_executor(resolve_executor(self.rollout.executor, self.rollout.workers)).in_process
        except LookupFailed:  # an unknown executor: RolloutConfig refuses it, naming the key
            return False

    def __post_init__(self) -> None:
        for name in ("total_steps", "tasks_per_step", "group_size", "keep_checkpoints"):
            if getattr(self, name) < 1:
                raise ConfigError.for_key(name, f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("val_every", "ckpt_every", "sample_groups"):
            if getattr(self, name) < 0:
                raise ConfigError.for_key(
                    name, f"{name} must be >= 0 (0 turns it off), got {getattr(self, name)}"
                )
        from rllm.algos.registry import get_loss

        if self.distill is not None and self.rollout.max_staleness > 0:
            # Both loops train through one step (rllm.engine.training.train_step), which scores with the
            # teacher in either, but distillation has only been proven on-policy (K = 0): no run
            # checks the teacher's scores, or the top-k loss, against samples of older weights.
            raise ConfigError.for_key(
                "rollout.max_staleness",
                f"on-policy distillation runs synchronously; rollout.max_staleness={self.rollout.max_staleness} "
                "is not supported with distill (set it to 0)",
            )
        check_group_baseline(self)
        check_policies(self.policies, self.roles, self.algorithm)
        if self.distill is not None and self.policies:
            raise ConfigError.for_key(
                "policies", "on-policy distillation trains one policy; remove `policies` or `distill`"
            )
        # distill.loss = "topk" trains with its own loss (set on the algorithm here).
        check_distill_loss(self.distill, self.algorithm)
        check_correction(self.rollout, self.algorithm.tis, get_loss(self.algorithm.loss).supervised)
        if self.algorithm.dynamic_sampling.enabled:
            check_dynamic_sampling(self)
        if self.val_every and not self.val_split:
            raise ConfigError.for_key(
                "val_split", "val_every is set but val_split is not: name the split to validate on"
            )


def check_group_baseline(config: TrainerConfig) -> None:
    """One rollout per task gives an estimator whose baseline is the task's group (GRPO, RLOO,
    ...) nothing to compare against: every advantage is 0 and nothing is learnt, silently. A
    distillation run's advantages are the teacher's, so it may sample once per task."""
    if config.group_size > 1 or config.distill is not None:
        return
    from rllm.algos.registry import get_estimator

    algorithm = config.algorithm
    for key, name in (("estimator", algorithm.estimator), *algorithm.estimator_by_role.items()):
        if get_estimator(name).group_baseline:
            where = "algorithm.estimator" if key == "estimator" else f"algorithm.estimator_by_role.{key}"
            raise ConfigError.for_key(
                "group_size",
                f"group_size=1 leaves {where}={name} no group baseline (each task's advantage would be 0): "
                "set group_size >= 2, or algorithm.estimator=reinforce or batch_norm",
            )


def check_dynamic_sampling(config: TrainerConfig) -> None:
    """``algorithm.dynamic_sampling`` counts groups whose rewards differ: refused where none can
    (one rollout a task) or where the rewards are not what trains (distillation)."""
    key = "algorithm.dynamic_sampling.enabled"
    if config.group_size < 2:
        raise ConfigError.for_key(
            key,
            f"group_size={config.group_size}: a group of one rollout never has rewards that differ, "
            "so every step would reach its cap; set group_size >= 2 or turn dynamic sampling off",
        )
    if config.distill is not None:
        raise ConfigError.for_key(
            key,
            "distillation trains on the teacher's per-token advantages, not on the rewards' "
            "differences within a group; turn dynamic sampling off",
        )


def load_config(
    path: str | Path | None, overrides: Iterable[str] = (), base: dict[str, Any] | None = None
) -> TrainerConfig:
    """``base``, then a TOML, YAML or JSON file (optional), then ``key.sub=value`` overrides,
    validated (see :mod:`rllm.types.config_file`)."""
    doc: dict[str, Any] = dict(base or {})
    if path is not None:
        doc = merge_config(doc, read_config_file(path))
    return config_from_dict(apply_overrides(doc, overrides))


def config_from_dict(doc: dict[str, Any]) -> TrainerConfig:
    """A TrainerConfig from plain data; a ConfigError naming the dotted key otherwise.

    Keys missing from the ``rollout`` section take the trainer's defaults
    (``TRAINING_ROLLOUT_DEFAULTS``), the others RolloutSettings' own.
    """
    rollout = doc.get("rollout", {})
    if isinstance(rollout, dict):
        for key, instead in TRAINER_DECIDES.items():
            if key in rollout:
                raise ConfigError.for_key(f"rollout.{key}", f"the trainer sets it: {instead}")
        for key, moved in MOVED_FROM_ROLLOUT.items():
            if key in rollout:
                raise ConfigError.for_key(f"rollout.{key}", f"moved to {moved}; use that key")
        doc = {**doc, "rollout": {**copy.deepcopy(TRAINING_ROLLOUT_DEFAULTS), **rollout}}
    return convert_config(default_correction(doc), TrainerConfig)
