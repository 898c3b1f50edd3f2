"""Where a sync evaluator runs: in a thread pool until it has shown itself cheap, then on the loop.

A sync evaluator used to run in the default thread pool on every call, so that a slow one (a
remote judge, a test harness) cannot stall the event loop every flow of the process shares. For
the common evaluator that compares strings in microseconds the hop costs far more than the work:
a pool thread wakes, takes the GIL from the busy loop thread and hands the result back through
the loop's self-pipe, which on a loaded interpreter is milliseconds of latency per rollout
(~9 ms per rollout in the #35 breakdown, in
benchmarks/history/issue-35.md, "#35 — whole system vs backend direct vs TRL to 0.9, quiet")
and a few tens of microseconds of CPU. So each engine watches its evaluator: after
``PROBATION_CALLS`` pool calls in a row that each took under ``CHEAP_S`` it runs the evaluator
inline; an inline call that takes ``SLOW_INLINE_S`` or more sends it back to the pool for good
(logged once). Async evaluators are unaffected (they run on the loop already). The deadline
(``eval_timeout_s``) is enforced on pool calls as before; an inline call, being one that was cheap
many times in a row, is not cut short: an evaluator that may block without bound after a run of
fast calls should be written ``async`` (with its own timeout) or set ``inline_ok = False`` on the
evaluator object, which keeps it in the pool.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable
from typing import Any

from rllm.engine.rollout.flow_runner import call_with_deadline

log = logging.getLogger(__name__)

# A pool call under this (wall time inside the pool thread) counts as cheap.
CHEAP_S = 0.002
# Cheap calls in a row before the evaluator runs inline.
PROBATION_CALLS = 16
# An inline call this slow blocked the loop: back to the pool for the rest of the run.
SLOW_INLINE_S = 0.005


class EvalDispatch:
    """Runs one engine's sync evaluator calls, in the pool or inline (see the module docstring)."""

    def __init__(self, evaluator: Any) -> None:
        self.name = getattr(evaluator, "name", repr(evaluator))
        # An evaluator may opt out (``inline_ok = False`` on the @evaluator function, the wrapper
        # or an Evaluator object): one that can block without bound.
        owners = (
            evaluator,
            getattr(evaluator, "fn", None),
            getattr(getattr(evaluator, "fn", None), "__self__", None),
        )
        self.allowed = all(getattr(o, "inline_ok", True) for o in owners if o is not None)
        self.cheap_streak = 0
        self.inline = False
        self.banned = not self.allowed
        self.pool_calls = 0  # observability (tests, benchmarks)
        self.inline_calls = 0

    async def call(self, fn: Callable[..., Any], args: tuple[Any, ...], *, deadline_s: float | None) -> Any:
        """``fn(*args)``: inline when it has proven cheap, else in the default pool under ``deadline_s``."""
        if self.inline:
            self.inline_calls += 1
            started = time.perf_counter()
            try:
                return fn(*args)
            finally:
                took = time.perf_counter() - started
                if took >= SLOW_INLINE_S:
                    self._ban(took)
        self.pool_calls += 1
        took_box: list[float] = []
        value = await call_with_deadline(
            _timed(fn, took_box),
            args,
            is_async=False,
            deadline_s=deadline_s,
            executor=None,  # the default pool: hung sync flows must not starve evaluation
        )
        if self.banned:
            return value
        if took_box and took_box[0] < CHEAP_S:
            self.cheap_streak += 1
            if self.cheap_streak >= PROBATION_CALLS:
                self.inline = True
                log.debug(
                    "evaluator %s runs inline from now on (%d cheap calls)", self.name, self.cheap_streak
                )
        else:
            self.cheap_streak = 0
        return value

    def _ban(self, took: float) -> None:
        self.inline, self.banned = False, True
        log.info(
            "evaluator %s took %.1f ms on the event loop: it runs in a thread pool from now on",
            self.name,
            took * 1000,
        )


def _timed(fn: Callable[..., Any], took_box: list[float]) -> Callable[..., Any]:
    """``fn``, recording how long each call took (in the thread that runs it) into ``took_box``."""

    def run(*args: Any) -> Any:
        started = time.perf_counter()
        value = fn(*args)
        # A sync callable that returned a coroutine does its work on the loop: never inline it.
        took_box.append(float("inf") if inspect.isawaitable(value) else time.perf_counter() - started)
        return value

    return run
