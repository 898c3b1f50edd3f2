"""Agent flows: ``@rollout`` for functions and the ``AgentFlow`` protocol for classes.

A flow is any code that, given a Task and an AgentConfig, talks to ``config.base_url`` with an
OpenAI-compatible client and returns what it produced. The gateway records every LLM call, so a
flow does not have to build Steps itself; it may return:

- ``None``: the traces are the whole story;
- a ``dict``: artifacts for the evaluator (e.g. ``{"answer": "42"}``);
- a ``str``: shorthand for ``{"answer": <str>}``;
- a ``Trajectory``: reward/metadata (and, without a gateway, steps) for its role ``name``;
- an ``Episode``: several trajectories, artifacts, metrics, a termination reason.

The same flow object runs unchanged for evaluation and training.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import pickle
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeAlias, cast, overload, runtime_checkable

from rllm.types import AgentConfig, Episode, Task, Trajectory
from rllm.types.errors import UsageError

FlowResult: TypeAlias = Episode | Trajectory | dict[str, Any] | str | None
FlowFunction: TypeAlias = Callable[[Task, AgentConfig], FlowResult | Awaitable[FlowResult]]


@runtime_checkable
class AgentFlow(Protocol):
    """A class-based flow: ``run`` may be a plain or an ``async`` method."""

    def run(self, task: Task, config: AgentConfig) -> FlowResult | Awaitable[FlowResult]: ...


class RolloutFlow:
    """A flow function wrapped by ``@rollout``; still callable exactly like the function."""

    def __init__(self, fn: FlowFunction, name: str | None = None, max_turns: int | None = None) -> None:
        if not callable(fn):
            raise UsageError(f"@rollout needs a function (task, config) -> result, got {fn!r}")
        _check_arity(fn, "@rollout", 2)
        self.fn = fn
        self.name = name or getattr(fn, "__name__", type(fn).__name__)
        self.max_turns = max_turns
        self.is_async = is_async_callable(fn)
        functools.update_wrapper(self, fn)

    def run(self, task: Task, config: AgentConfig) -> FlowResult | Awaitable[FlowResult]:
        return self.fn(task, config)

    def __call__(self, task: Task, config: AgentConfig) -> FlowResult | Awaitable[FlowResult]:
        return self.fn(task, config)

    def __repr__(self) -> str:
        kind = "async " if self.is_async else ""
        return f"<{kind}rollout flow {self.name!r}>"

    def __reduce__(self) -> tuple[Any, ...]:
        return reduce_by_name(self)


@overload
def rollout(fn: FlowFunction, /) -> RolloutFlow: ...
@overload
def rollout(
    *, name: str | None = None, max_turns: int | None = None
) -> Callable[[FlowFunction], RolloutFlow]: ...


def rollout(
    fn: FlowFunction | None = None, /, *, name: str | None = None, max_turns: int | None = None
) -> RolloutFlow | Callable[[FlowFunction], RolloutFlow]:
    """Mark a sync or async function ``(task, config) -> result`` as an agent flow.

    Use bare (``@rollout``) or with options (``@rollout(name="solver")``). ``max_turns`` is
    advisory metadata for the flow's own loop; the engine enforces only the deadline.
    """
    if fn is not None:
        return RolloutFlow(fn, name=name, max_turns=max_turns)

    def wrap(inner: FlowFunction) -> RolloutFlow:
        return RolloutFlow(inner, name=name, max_turns=max_turns)

    return wrap


def as_flow(obj: Any) -> RolloutFlow:
    """Normalise anything flow-like (RolloutFlow, AgentFlow instance, function) to a RolloutFlow."""
    if isinstance(obj, RolloutFlow):
        return obj
    if isinstance(obj, type):
        raise UsageError(f"expected a flow instance, got the class {obj.__name__}; instantiate it first")
    run = getattr(obj, "run", None)
    if callable(run):
        return RolloutFlow(cast(FlowFunction, run), name=type(obj).__name__)
    if callable(obj):
        return RolloutFlow(cast(FlowFunction, obj))
    raise UsageError(
        f"expected a flow: a @rollout function, a function (task, config) or an object with run(task, config); got {obj!r}"
    )


def reduce_by_name(wrapper: Any) -> tuple[Any, ...]:
    """Pickle a decorated function's wrapper by reference (module + qualified name), as pickle
    does for plain functions: the wrapped function itself cannot be pickled by reference, since
    its module attribute is the wrapper. Lets worker processes receive module-level flows."""
    module, qualname = getattr(wrapper, "__module__", None), getattr(wrapper, "__qualname__", "")
    if not module or "<locals>" in qualname or "<lambda>" in qualname:
        raise pickle.PicklingError(f"{wrapper!r} is not defined at module level, so it cannot be pickled")
    return (_import_by_name, (module, qualname))


def _import_by_name(module: str, qualname: str) -> Any:
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def is_async_callable(fn: Any) -> bool:
    """True for ``async def`` functions/methods, also behind partials and callable objects."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004 - a callable object's own __call__
    return call is not None and inspect.iscoroutinefunction(call)


def _check_arity(fn: Any, what: str, n: int) -> None:
    """Fail at decoration time, naming the function, if it cannot take ``n`` positional args."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins etc.: let the call itself fail
        return
    try:
        sig.bind(*([None] * n))
    except TypeError:
        name = getattr(fn, "__qualname__", repr(fn))
        raise UsageError(f"{what} function {name}{sig} must accept {n} positional arguments") from None
