"""Run one flow or evaluator call: async ones on the event loop, sync ones in a thread pool.

Deadlines: an async flow is cancelled when its deadline passes (its HTTP calls are aborted and
its ``finally`` blocks run). A deadline stands still while its :class:`DeadlineClock` is held:
the engine holds it while its gateway holds calls at the door (a weight sync, or the train step
that a prefetched rollout waits for), time the flow cannot use. A sync flow cannot be force-killed in Python; when it misses its
deadline its result is discarded and the engine deletes its session, so any later call it makes
fails fast and it soon gives up its thread.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from rllm.types.errors import RLLMError


class DeadlineExceeded(RLLMError, TimeoutError):
    """The engine's deadline (not a timeout inside the flow) expired."""


class DeadlineClock:
    """The running deadlines of one engine's rollouts, which stand still while the clock is held.

    ``hold(True)`` takes every live deadline off the loop's timer, keeping the time each had
    left; ``hold(False)`` puts them back with that time. A rollout that starts while the clock is
    held gets its whole deadline when it is released. Called on the event loop's thread only.
    """

    def __init__(self) -> None:
        self.held = False
        self._left: dict[asyncio.Timeout, float | None] = {}  # seconds left, while held

    def hold(self, held: bool) -> None:
        if held == self.held:
            return
        self.held = held
        now = asyncio.get_running_loop().time()
        for timeout, left in self._left.items():
            if timeout.expired():  # already cancelling its rollout: too late to stop
                continue
            if held:
                when = timeout.when()
                self._left[timeout] = None if when is None else max(0.0, when - now)
                timeout.reschedule(None)
            elif left is not None:
                timeout.reschedule(now + left)

    def pending(self) -> list[float | None]:
        """When each live deadline fires, in the loop's time (None: standing still)."""
        return [timeout.when() for timeout in self._left]

    def track(self, timeout: asyncio.Timeout, deadline_s: float | None) -> None:
        self._left[timeout] = deadline_s
        if self.held:
            timeout.reschedule(None)

    def untrack(self, timeout: asyncio.Timeout) -> None:
        self._left.pop(timeout, None)


async def call_with_deadline(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    *,
    is_async: bool,
    deadline_s: float | None,
    executor: Executor | None,
    clock: DeadlineClock | None = None,
) -> Any:
    """``fn(*args)`` within ``deadline_s`` seconds; raises DeadlineExceeded when it runs over.

    A TimeoutError raised by the flow itself (its own client timeout) propagates unchanged, so
    it is not mistaken for the engine's deadline. ``clock``: the deadline does not run while it
    is held.
    """
    timeout = asyncio.timeout(deadline_s)
    try:
        async with timeout:
            if clock is not None and deadline_s is not None:
                clock.track(timeout, deadline_s)
            try:
                if is_async:
                    result = fn(*args)
                else:
                    loop = asyncio.get_running_loop()
                    ctx = contextvars.copy_context()
                    result = await loop.run_in_executor(executor, functools.partial(ctx.run, fn, *args))
                if inspect.isawaitable(result):  # a sync callable that returned a coroutine
                    result = await result
                return result
            finally:
                if clock is not None:
                    clock.untrack(timeout)
    except TimeoutError:
        if timeout.expired():
            raise DeadlineExceeded(f"exceeded its {deadline_s:g} s deadline") from None
        raise
