"""Several policies in one run: one base model, one LoRA adapter per policy.

A training config names its policies and maps agent roles to them::

    policies:
      judge: {lora: {rank: 8}, learning_rate: 5.0e-5, algorithm: {estimator: rloo}}
    roles: {judge: judge}

A role without a mapping trains the ``default`` policy, which is the run's own
(``backend.options`` and ``algorithm``). Each policy's ``algorithm`` keys override the run's for
that policy's groups (filters, advantages and loss); its ``lora`` and optimizer keys override the
backend's for its adapter. Everything is checked when the config is loaded: an unknown key at any
depth, a role mapped to a policy that does not exist, a policy no role trains.

The gateway routes each call to its policy (rllm.gateway.policy_routes: by the call's role, or by
the model name the agent asks for); one train step groups, scores and trains each policy's
trajectories on their own (``train_policies``) and updates every policy that has data.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from rllm.algos import compute_advantages, filter_groups
from rllm.algos.adapters import LoraConfig
from rllm.algos.config import AlgorithmConfig
from rllm.engine.training.sequences import sequences_from_groups
from rllm.types import ConfigError, TrainSequence, Trajectory, TrajectoryGroup
from rllm.types.config_file import merge_config, parse_options
from rllm.types.errors import InputError

if TYPE_CHECKING:
    from rllm.engine.backend import Backend

DEFAULT_POLICY = "default"
# A policy's name is a metric prefix, a checkpoint folder and a served model name.
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
# Algorithm keys that decide the whole step, not one policy's groups.
RUN_WIDE_ALGORITHM_KEYS = ("dynamic_sampling", "max_mismatch")


class PolicySection(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``policies.NAME``: what one policy changes from the run's defaults (None: the run's)."""

    lora: LoraConfig | None = None  # its adapter's shape (None: backend.options.lora)
    learning_rate: float | None = None
    weight_decay: float | None = None
    grad_clip: float | None = None
    algorithm: dict[str, Any] = msgspec.field(default_factory=dict)  # overrides of `algorithm`


def check_policies(
    policies: Mapping[str, PolicySection], roles: Mapping[str, str], algorithm: AlgorithmConfig
) -> None:
    """Refuse a policy set that cannot train as written (ConfigError naming the key)."""
    for name, section in policies.items():
        if name == DEFAULT_POLICY:
            raise ConfigError.for_key(
                f"policies.{name}",
                "the default policy is the run's own (backend.options and algorithm); name this one otherwise",
            )
        if not _NAME.fullmatch(name):
            raise ConfigError.for_key(
                f"policies.{name}",
                "a policy's name starts with a letter and has only letters, digits, '_' and '-' (at most 64)",
            )
        for key in ("learning_rate", "weight_decay", "grad_clip"):
            value = getattr(section, key)
            if value is not None and (value != value or value < 0 or (key == "learning_rate" and value == 0)):
                raise ConfigError.for_key(f"policies.{name}.{key}", f"must be a number > 0, got {value}")
        if section.lora is not None and section.lora.rank < 1:
            raise ConfigError.for_key(
                f"policies.{name}.lora.rank", "a policy is a LoRA adapter: rank must be >= 1"
            )
        policy_algorithm(algorithm, name, section)  # refuses unknown or run-wide keys
    known = [*sorted(policies), DEFAULT_POLICY]
    for role, policy in roles.items():
        if policy not in known:
            raise ConfigError.for_key(
                f"roles.{role}",
                f"role {role!r} maps to unknown policy {policy!r} (policies: {', '.join(known)})",
            )
    for name in policies:
        if name not in roles.values():
            raise ConfigError.for_key(
                f"policies.{name}", f"no role trains policy {name!r}: map one in `roles` (roles.ROLE: {name})"
            )


def policy_algorithm(algorithm: AlgorithmConfig, name: str, section: PolicySection) -> AlgorithmConfig:
    """The run's algorithm with policy ``name``'s overrides (ConfigError naming the key)."""
    if not section.algorithm:
        return algorithm
    for key in RUN_WIDE_ALGORITHM_KEYS:
        if key in section.algorithm:
            raise ConfigError.for_key(
                f"policies.{name}.algorithm.{key}",
                "is decided for the whole step, not per policy: set it in `algorithm`",
            )
    doc = merge_config(msgspec.to_builtins(algorithm), section.algorithm)
    return parse_options(doc, AlgorithmConfig, prefix=f"policies.{name}.algorithm")


class PolicyMap:
    """A run's policies: which policy trains each role, and with which algorithm."""

    def __init__(
        self, policies: Mapping[str, PolicySection], roles: Mapping[str, str], algorithm: AlgorithmConfig
    ) -> None:
        self.sections = dict(policies)
        self.roles = dict(roles)
        self.algorithms = {DEFAULT_POLICY: algorithm} | {
            name: policy_algorithm(algorithm, name, section) for name, section in policies.items()
        }

    @property
    def names(self) -> list[str]:
        """Every policy, the default first."""
        return list(self.algorithms)

    def policy_of(self, role: str) -> str:
        return self.roles.get(role, DEFAULT_POLICY)

    def split(self, groups: Sequence[TrajectoryGroup]) -> dict[str, list[TrajectoryGroup]]:
        """``groups`` (one per task and role) by the policy that answered their calls (each
        step records it), else the one their role trains; in policy order."""
        out: dict[str, list[TrajectoryGroup]] = {}
        for group in groups:
            out.setdefault(self.group_policy(group), []).append(group)
        return {name: out[name] for name in self.names if name in out}

    def trajectory_policy(self, trajectory: Trajectory) -> str:
        """The policy that answered ``trajectory``'s calls (its steps record it), else its role's."""
        answered = {s.metadata["policy"] for s in trajectory.steps if "policy" in s.metadata}
        return answered.pop() if len(answered) == 1 else self.policy_of(trajectory.role)

    def group_policy(self, group: TrajectoryGroup) -> str:
        answered = {
            s.metadata["policy"] for t in group.trajectories for s in t.steps if "policy" in s.metadata
        }
        if len(answered) > 1:
            raise InputError(
                f"role {group.role!r} of task {group.task_id!r} was answered by policies "
                f"{', '.join(sorted(answered))}: one trajectory trains one policy, so give each its own role"
            )
        policy = answered.pop() if answered else self.policy_of(group.role)
        if policy not in self.algorithms:
            raise InputError(f"role {group.role!r} was answered by unknown policy {policy!r}")
        return policy


async def train_policies(
    policies: PolicyMap, groups: Sequence[TrajectoryGroup], backend: Backend
) -> tuple[list[TrajectoryGroup], list[TrainSequence], dict[str, float]]:
    """Filter, score and train each policy's groups on their own: (kept groups, every trained
    sequence, metrics). A policy's metrics are ``policy/NAME/...``; the run-level ``filter/``,
    ``advantage/`` and ``train/`` figures are the means over the policies that have them."""
    train = policy_trainer(backend)
    kept_all: list[TrajectoryGroup] = []
    sequences_all: list[TrainSequence] = []
    metrics: dict[str, float] = {}
    run_level: dict[str, list[float]] = {}
    for name, policy_groups in policies.split(groups).items():
        algo = policies.algorithms[name]
        kept, filter_metrics = filter_groups(policy_groups, algo)
        figures = {f"filter/{k}": v for k, v in filter_metrics.items()}
        figures |= {f"advantage/{k}": v for k, v in compute_advantages(kept, algo).items()}
        sequences = sequences_from_groups(kept)
        for sequence in sequences:
            sequence.metadata["policy"] = name
        if sequences:
            figures |= {f"train/{k}": v for k, v in (await train(name, sequences, algo)).items()}
        figures["train/sequences"] = len(sequences)
        for key, value in figures.items():
            metrics[f"policy/{name}/{key}"] = value
            run_level.setdefault(key, []).append(value)
        kept_all += kept
        sequences_all += sequences
    metrics |= {
        key: statistics.fmean(values) for key, values in run_level.items() if key != "train/sequences"
    }
    return kept_all, sequences_all, metrics


def policy_trainer(backend: Backend) -> Any:
    """The backend's ``train_policy_step(policy, batch, algo)`` (use_policies accepted it)."""
    train = getattr(backend, "train_policy_step", None)
    if train is None:
        raise ConfigError.for_key("policies", f"backend {backend.name!r} cannot train several policies")
    return train


def use_policies(policies: Mapping[str, PolicySection], algorithm: AlgorithmConfig, backend: Backend) -> None:
    """Hand the backend the run's ``policies`` before it starts, and check each policy's algorithm
    (the run's ``algorithm`` with its overrides) against it; a ConfigError with the backend's
    reason where it cannot train several (BackendBase.use_policies refuses by default)."""
    if not policies:
        return
    use = getattr(backend, "use_policies", None)
    if use is None:
        raise ConfigError.for_key(
            "policies", f"backend {backend.name!r} trains one policy: remove `policies` and `roles`"
        )
    use(dict(policies))
    for name, section in policies.items():
        try:
            backend.validate(policy_algorithm(algorithm, name, section))
        except ValueError as exc:
            raise ConfigError.for_key(
                f"policies.{name}.algorithm", f"backend {backend.name!r} cannot run it: {exc}"
            ) from None


def gateway_routes(
    policies: Mapping[str, PolicySection], roles: Mapping[str, str], backend: Backend
) -> dict[str, Any]:
    """The gateway's ``policies`` and ``roles`` (rllm.gateway.policy_routes) for a run's
    ``policies`` and ``roles``."""
    if not policies:
        return {}
    return {"policies": backend.policy_model_names(), "roles": dict(roles)}  # pyright: ignore[reportAttributeAccessIssue]


async def publish_policy_models(
    policies: Mapping[str, PolicySection], backend: Backend, gateway: Any
) -> None:
    """After a sync (or a resume): each policy's served model name to the gateway, for a backend
    that serves every synced checkpoint under a new name (remote Tinker's sampler paths)."""
    if policies:
        await gateway.set_policy_models(backend.policy_model_names())  # pyright: ignore[reportAttributeAccessIssue]


__all__ = [
    "DEFAULT_POLICY",
    "PolicyMap",
    "PolicySection",
    "check_policies",
    "gateway_routes",
    "policy_algorithm",
    "publish_policy_models",
    "train_policies",
    "use_policies",
]
