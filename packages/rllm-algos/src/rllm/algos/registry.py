"""The registries of advantage estimators and policy losses: looked up by name, extensible by users.

An **estimator** is ``fn(batch: RewardBatch, config: AlgorithmConfig) -> np.ndarray``: one
advantage per row of ``batch``, for all groups at once (see RewardBatch's vectorised helpers).
A **loss** is ``fn(logprobs, old_logprobs, advantages, mask, config) -> (loss, metrics)``: per-token
torch tensors [batch, tokens] in, the per-token loss and per-token metric tensors out (see
rllm.algos.losses.policy); rllm.algos.losses aggregates, adds TIS, KL and entropy around it.

Three ways to add one, each selected with ``AlgorithmConfig(estimator=...)`` / ``loss=...``:

* in-process: ``@register_estimator("mine")`` / ``@register_loss("mine")``;
* an installed package's entry point, so ``rllm train`` finds it without code: in its
  ``pyproject.toml``, ``[project.entry-points."rllm.estimators"] mine = "my_pkg.adv:mine"`` (or
  ``"rllm.losses"``). The target is the function, a ready ``EstimatorSpec`` / ``LossSpec``, or a
  module whose import registers the name itself. A bare function declares nothing; a loss that
  clips its ratio (``tis = "trust_region"``) or has a Tinker-API twin says so in its
  ``LossSpec`` (``clips_ratio``, ``tinker_loss``) or its ``register_loss`` call. Entry points are read once per process
  (``refresh_plugins()`` reads them again) and a target is imported only when first looked up;
* built-ins, registered here by name (the losses' torch code is imported on first use, so
  validating a config never needs torch).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from rllm.types.errors import InputError, LookupFailed, UsageError

if TYPE_CHECKING:
    from rllm.algos.config import AlgorithmConfig
    from rllm.algos.reward_batch import RewardBatch

EstimatorFn = Callable[["RewardBatch", "AlgorithmConfig"], np.ndarray]
# (logprobs, old_logprobs, advantages, mask, config) -> (loss [batch, tokens], {metric: tensor})
LossFn = Callable[..., tuple[Any, dict[str, Any]]]

ESTIMATORS_GROUP = "rllm.estimators"
LOSSES_GROUP = "rllm.losses"


def _check_name(kind: str, name: object) -> None:
    if not isinstance(name, str) or not name:
        raise InputError(f"{kind} name must be a non-empty string, got {name!r}")


@dataclass(frozen=True)
class EstimatorSpec:
    """A registered estimator. ``step_credit`` forces a credit mode ("turn") regardless of config."""

    name: str
    fn: EstimatorFn
    step_credit: str | None = None
    # The baseline is the task's own group: a group of one (group_size = 1) gets advantage 0.
    group_baseline: bool = False


@dataclass(frozen=True)
class LossSpec:
    """A registered policy loss. ``supervised`` losses train on the log-probs alone: they take no
    old log-probs and no advantages (both arrive as None). ``target`` ("module:function") stands
    in for ``fn`` until first use, so naming a loss never imports torch. ``teacher_topk`` losses
    train the student's distribution toward a distillation teacher's top-k per position
    (``rllm.algos.losses.distill``): a backend runs them with the student's logprobs of the
    teacher's tokens, not through ``compute_policy_loss``, or refuses them in ``validate``.
    ``inert_at_zero_advantage``: the loss (and its gradient) is 0 at every token whose advantage
    is 0, so a backend may leave such sequences out of the forward/backward pass and count them
    only in the loss's denominators (``zero_advantage_rows_inert``).
    ``clips_ratio``: the loss clips its importance ratio (its own trust region: ``clip_low`` /
    ``clip_high``), so ``tis = "trust_region"`` can take that region around the sampler's policy;
    a loss that does not declare it refuses that mode, and asynchronous runs default it to token
    TIS instead. ``tinker_loss``: the Tinker-API services' built-in ``loss_fn`` that computes this
    same loss (given ``clip_low``/``clip_high`` as its thresholds when it ``clips_ratio``); ""
    means none, so a Tinker-API backend runs ``fn`` client-side (``forward_backward_custom``).

    This is the one declaration of a loss: config validation, the engine's asynchronous defaults,
    the capability matrix and every backend read these fields, never a list of names."""

    name: str
    fn: LossFn | None = None
    target: str = ""
    supervised: bool = False
    teacher_topk: bool = False
    inert_at_zero_advantage: bool = False
    clips_ratio: bool = False
    tinker_loss: str = ""

    def __post_init__(self) -> None:
        _check_name("loss", self.name)
        if self.supervised and self.clips_ratio:
            raise InputError(f"loss {self.name!r}: a supervised loss has no importance ratio to clip")

    def load(self) -> LossFn:
        """The loss function (imported from ``target`` the first time)."""
        if self.fn is not None:
            return self.fn
        module, _, attr = self.target.partition(":")
        return getattr(importlib.import_module(module), attr)


_ESTIMATORS: dict[str, EstimatorSpec] = {}


def _policy_gradient(name: str, *, clips_ratio: bool, tinker_loss: str = "") -> LossSpec:
    """A built-in policy-gradient loss of rllm.algos.losses.policy (each multiplies every token's
    term by its advantage, so all are inert at a zero advantage)."""
    return LossSpec(
        name,
        target=f"rllm.algos.losses.policy:{name}",
        inert_at_zero_advantage=True,
        clips_ratio=clips_ratio,
        tinker_loss=tinker_loss,
    )


# The built-in losses, one declaration each (dual_clip has no Tinker twin: it runs client-side).
_BUILTIN_SPECS: tuple[LossSpec, ...] = (
    _policy_gradient("ppo_clip", clips_ratio=True, tinker_loss="ppo"),
    _policy_gradient("dual_clip", clips_ratio=True),
    _policy_gradient("gspo", clips_ratio=True, tinker_loss="gspo"),
    _policy_gradient("cispo", clips_ratio=True, tinker_loss="cispo"),
    _policy_gradient("importance_sampling", clips_ratio=False, tinker_loss="importance_sampling"),
    LossSpec(
        "cross_entropy",
        target="rllm.algos.losses.policy:cross_entropy",
        supervised=True,
        tinker_loss="cross_entropy",
    ),
)
BUILTIN_LOSSES: tuple[str, ...] = tuple(spec.name for spec in _BUILTIN_SPECS)
_LOSSES: dict[str, LossSpec] = {spec.name: spec for spec in _BUILTIN_SPECS}
# Dense distillation over the teacher's top-k (rllm.algos.losses.distill): KL(teacher || student)
# and KL(student || teacher), each over the top-k tokens plus one bucket for the rest.
TOPK_LOSSES: tuple[str, ...] = ("topk_forward_kl", "topk_reverse_kl")
for _name in TOPK_LOSSES:
    _LOSSES[_name] = LossSpec(
        _name, target="rllm.algos.losses.distill:policy_call_refused", supervised=True, teacher_topk=True
    )
_PLUGINS: dict[str, dict[str, EntryPoint]] = {}


def register_estimator(
    name: str, *, step_credit: str | None = None, group_baseline: bool = False, replace: bool = False
) -> Callable[[EstimatorFn], EstimatorFn]:
    """Decorator: make ``fn`` available as estimator ``name``. ``group_baseline``: its baseline
    is the other rollouts of the same task, so a run with one rollout per task is refused.

    Registering an existing name is an error unless ``replace=True``, so two plugins cannot
    silently shadow each other.
    """
    _check_name("estimator", name)
    if step_credit not in (None, "broadcast", "turn"):
        raise InputError(f"step_credit must be None, 'broadcast' or 'turn', got {step_credit!r}")

    def decorate(fn: EstimatorFn) -> EstimatorFn:
        if name in _ESTIMATORS and not replace:
            raise InputError(f"estimator {name!r} is already registered (pass replace=True to override it)")
        _ESTIMATORS[name] = EstimatorSpec(
            name=name, fn=fn, step_credit=step_credit, group_baseline=group_baseline
        )
        return fn

    return decorate


def register_loss(
    name: str,
    *,
    supervised: bool = False,
    inert_at_zero_advantage: bool = False,
    clips_ratio: bool = False,
    tinker_loss: str = "",
    replace: bool = False,
) -> Callable[[LossFn], LossFn]:
    """Decorator: make ``fn`` available as loss ``name`` (``replace=True`` to override one).
    ``inert_at_zero_advantage``: see LossSpec (declare it only when every token's term is 0,
    with a zero gradient, wherever its advantage is 0). ``clips_ratio``: the loss clips its
    importance ratio, so it accepts ``tis = "trust_region"``. ``tinker_loss``: the Tinker-API
    built-in that computes the same loss (see LossSpec)."""
    _check_name("loss", name)

    def decorate(fn: LossFn) -> LossFn:
        if name in _LOSSES and not replace:
            raise InputError(f"loss {name!r} is already registered (pass replace=True to override it)")
        _LOSSES[name] = LossSpec(
            name,
            fn=fn,
            supervised=supervised,
            inert_at_zero_advantage=inert_at_zero_advantage,
            clips_ratio=clips_ratio,
            tinker_loss=tinker_loss,
        )
        return fn

    return decorate


def unregister_estimator(name: str) -> None:
    """Remove a registered estimator (mainly for tests and plugins that clean up)."""
    _ESTIMATORS.pop(name, None)


def unregister_loss(name: str) -> None:
    """Remove a registered loss (mainly for tests and plugins that clean up)."""
    _LOSSES.pop(name, None)


def get_estimator(name: str) -> EstimatorSpec:
    """The estimator registered as ``name``; a LookupFailed (a KeyError) listing the known names otherwise."""
    _load_builtins()
    spec = _ESTIMATORS.get(name) or _from_plugin(ESTIMATORS_GROUP, name, _ESTIMATORS, _as_estimator)
    if spec is None:
        raise LookupFailed(
            f"unknown advantage estimator {name!r}; known: {', '.join(sorted(available_estimators()))}"
        )
    return spec


def get_loss(name: str) -> LossSpec:
    """The loss registered as ``name``; a LookupFailed (a KeyError) listing the known names otherwise."""
    spec = _LOSSES.get(name) or _from_plugin(LOSSES_GROUP, name, _LOSSES, _as_loss)
    if spec is None:
        raise LookupFailed(f"unknown policy loss {name!r}; known: {', '.join(sorted(available_losses()))}")
    return spec


def available_estimators() -> frozenset[str]:
    """Names of every estimator: built-in, registered, or offered by an installed entry point."""
    _load_builtins()
    return frozenset(_ESTIMATORS) | frozenset(_plugins(ESTIMATORS_GROUP))


def available_losses() -> frozenset[str]:
    """Names of every loss: built-in, registered, or offered by an installed entry point."""
    return frozenset(_LOSSES) | frozenset(_plugins(LOSSES_GROUP))


def ratio_clipping_losses() -> list[str]:
    """The losses loaded so far (built-in, registered, or a plugin already looked up) that declare
    ``clips_ratio``: the ones ``tis = "trust_region"`` can run with. For a message; to decide
    about one loss, ask ``get_loss(name).clips_ratio``, which also loads a plugin."""
    return sorted(name for name, spec in _LOSSES.items() if spec.clips_ratio)


def step_credit_for(role: str, config: AlgorithmConfig) -> str:
    """The step credit a role's advantages use: its estimator's own, else ``config.step_credit``."""
    return get_estimator(config.estimator_for(role)).step_credit or config.step_credit


def refresh_plugins() -> None:
    """Read the ``rllm.estimators`` / ``rllm.losses`` entry points again (after installing a
    package into the running process's path)."""
    _PLUGINS.clear()


def _plugins(group: str) -> dict[str, EntryPoint]:
    if group not in _PLUGINS:
        _PLUGINS[group] = {ep.name: ep for ep in entry_points(group=group)}
    return _PLUGINS[group]


def _from_plugin(group: str, name: str, registry: dict[str, Any], wrap: Callable[[str, Any], Any]) -> Any:
    """Load the entry point ``name`` of ``group`` into ``registry``; None when there is none."""
    point = _plugins(group).get(name)
    if point is None:
        return None
    loaded = point.load()
    if name not in registry:  # the import may have registered the name itself
        registry[name] = wrap(name, loaded)
    return registry[name]


def _as_estimator(name: str, loaded: Any) -> EstimatorSpec:
    if isinstance(loaded, EstimatorSpec):
        return loaded
    if callable(loaded):
        return EstimatorSpec(name=name, fn=cast(EstimatorFn, loaded))
    raise UsageError(f"entry point {ESTIMATORS_GROUP}:{name} is {loaded!r}, not an estimator function")


def _as_loss(name: str, loaded: Any) -> LossSpec:
    if isinstance(loaded, LossSpec):
        return loaded
    if callable(loaded):
        return LossSpec(name, fn=cast(LossFn, loaded))
    raise UsageError(f"entry point {LOSSES_GROUP}:{name} is {loaded!r}, not a loss function")


def _load_builtins() -> None:
    # Imported lazily: the built-in estimators register themselves through this module.
    import rllm.algos.estimators  # noqa: F401
