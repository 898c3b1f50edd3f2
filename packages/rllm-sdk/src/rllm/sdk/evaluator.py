"""Evaluators: ``@evaluator`` for functions and the ``Evaluator`` protocol for classes.

An evaluator scores one finished episode against its task. It may return an ``EvalOutput`` or,
for brevity, a ``float`` (reward), a ``bool`` (correct → 1.0, else 0.0) or a ``(reward,
is_correct)`` tuple; :func:`to_eval_output` turns all of them into an ``EvalOutput``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeAlias, cast, runtime_checkable

from rllm.sdk.flow import _check_arity, is_async_callable, reduce_by_name
from rllm.types import Episode, EvalOutput, Task
from rllm.types.errors import InputError, UsageError

EvalResult: TypeAlias = EvalOutput | float | bool | tuple[float, bool]
EvalFunction: TypeAlias = Callable[[Task, Episode], EvalResult | Awaitable[EvalResult]]


@runtime_checkable
class Evaluator(Protocol):
    """A class-based evaluator: ``evaluate`` may be a plain or an ``async`` method."""

    def evaluate(self, task: Task, episode: Episode) -> EvalResult | Awaitable[EvalResult]: ...


class EvaluatorFn:
    """An evaluator function wrapped by ``@evaluator``; still callable like the function."""

    def __init__(self, fn: EvalFunction, name: str | None = None) -> None:
        if not callable(fn):
            raise UsageError(f"@evaluator needs a function (task, episode) -> result, got {fn!r}")
        _check_arity(fn, "@evaluator", 2)
        self.fn = fn
        self.name = name or getattr(fn, "__name__", type(fn).__name__)
        self.is_async = is_async_callable(fn)
        functools.update_wrapper(self, fn)

    def evaluate(self, task: Task, episode: Episode) -> EvalResult | Awaitable[EvalResult]:
        return self.fn(task, episode)

    def __reduce__(self) -> tuple[Any, ...]:
        return reduce_by_name(self)

    def __call__(self, task: Task, episode: Episode) -> EvalResult | Awaitable[EvalResult]:
        return self.fn(task, episode)

    def __repr__(self) -> str:
        return f"<evaluator {self.name!r}>"


def evaluator(fn: EvalFunction | None = None, /, *, name: str | None = None) -> Any:
    """Mark a sync or async function ``(task, episode) -> EvalOutput | float | bool | (float, bool)``."""
    if fn is not None:
        return EvaluatorFn(fn, name=name)
    return lambda inner: EvaluatorFn(inner, name=name)


def as_evaluator(obj: Any) -> EvaluatorFn:
    """Normalise an evaluator (EvaluatorFn, Evaluator instance or function) to an EvaluatorFn."""
    if isinstance(obj, EvaluatorFn):
        return obj
    if isinstance(obj, type):
        raise UsageError(
            f"expected an evaluator instance, got the class {obj.__name__}; instantiate it first"
        )
    method = getattr(obj, "evaluate", None)
    if callable(method):
        return EvaluatorFn(cast(EvalFunction, method), name=type(obj).__name__)
    if callable(obj):
        return EvaluatorFn(cast(EvalFunction, obj))
    raise UsageError(
        f"expected an evaluator: an @evaluator function, a function (task, episode) or an object with "
        f"evaluate(task, episode); got {obj!r}"
    )


def to_eval_output(value: Any, source: str = "evaluator") -> EvalOutput:
    """Normalise an evaluator's return value; raise TypeError/ValueError naming ``source`` if unusable.

    A bare float leaves ``is_correct`` unset (partial credit is not a verdict); a bool sets both.
    """
    if isinstance(value, EvalOutput):
        _check_reward(value.reward, source)
        return value
    if isinstance(value, bool):
        return EvalOutput(reward=1.0 if value else 0.0, is_correct=value)
    if isinstance(value, int | float):
        return EvalOutput(reward=_check_reward(value, source))
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], bool):
        reward, correct = value
        if isinstance(reward, bool) or not isinstance(reward, int | float):
            raise UsageError(
                f"{source} returned a tuple whose reward is {type(reward).__name__}, expected a number"
            )
        return EvalOutput(reward=_check_reward(reward, source), is_correct=correct)
    raise UsageError(
        f"{source} returned {type(value).__name__} ({value!r:.80}); expected EvalOutput, float, bool or "
        f"(float, bool)"
    )


def _check_reward(reward: float, source: str) -> float:
    reward = float(reward)
    if not math.isfinite(reward):
        raise InputError(f"{source} returned a non-finite reward {reward}")
    return reward
