"""The estimator registry: advantage estimators are looked up by name, so users can add their own.

An estimator is a function ``(batch: RewardBatch, config: AlgorithmConfig) -> np.ndarray`` that
returns one advantage per row of ``batch`` and works on all groups at once (see RewardBatch's
vectorised group helpers). Register it with ``@register_estimator("my_name")`` and select it with
``AlgorithmConfig(estimator="my_name")`` or per role in ``estimator_by_role``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from rllm.types.errors import InputError, LookupFailed

if TYPE_CHECKING:
    from rllm.algos.config import AlgorithmConfig
    from rllm.algos.reward_batch import RewardBatch

EstimatorFn = Callable[["RewardBatch", "AlgorithmConfig"], np.ndarray]


@dataclass(frozen=True)
class EstimatorSpec:
    """A registered estimator. ``step_credit`` forces a credit mode ("turn") regardless of config."""

    name: str
    fn: EstimatorFn
    step_credit: str | None = None


_REGISTRY: dict[str, EstimatorSpec] = {}


def register_estimator(
    name: str, *, step_credit: str | None = None, replace: bool = False
) -> Callable[[EstimatorFn], EstimatorFn]:
    """Decorator: make ``fn`` available as estimator ``name``.

    Registering an existing name is an error unless ``replace=True``, so two plugins cannot
    silently shadow each other.
    """
    if not isinstance(name, str) or not name:
        raise InputError(f"estimator name must be a non-empty string, got {name!r}")
    if step_credit not in (None, "broadcast", "turn"):
        raise InputError(f"step_credit must be None, 'broadcast' or 'turn', got {step_credit!r}")

    def decorate(fn: EstimatorFn) -> EstimatorFn:
        if name in _REGISTRY and not replace:
            raise InputError(f"estimator {name!r} is already registered (pass replace=True to override it)")
        _REGISTRY[name] = EstimatorSpec(name=name, fn=fn, step_credit=step_credit)
        return fn

    return decorate


def unregister_estimator(name: str) -> None:
    """Remove a registered estimator (mainly for tests and plugins that clean up)."""
    _REGISTRY.pop(name, None)


def get_estimator(name: str) -> EstimatorSpec:
    """The estimator registered as ``name``; a KeyError listing the known names otherwise."""
    _load_builtins()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise LookupFailed(f"unknown advantage estimator {name!r}; known: {sorted(_REGISTRY)}") from None


def available_estimators() -> frozenset[str]:
    """Names of every registered estimator (built-ins included)."""
    _load_builtins()
    return frozenset(_REGISTRY)


def _load_builtins() -> None:
    # Imported lazily: the built-ins register themselves through this module.
    import rllm.algos.estimators  # noqa: F401
