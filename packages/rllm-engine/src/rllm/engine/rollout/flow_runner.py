"""Run one flow or evaluator call: async ones on the event loop, sync ones in a thread pool.

Deadlines: an async flow is cancelled when its deadline passes (its HTTP calls are aborted and
its ``finally`` blocks run). A deadline counts the time a rollout was *stalled*, not time spent
queued behind other rollouts sharing one sampler. Through its :class:`DeadlineClock`:

- it stands still while the clock is held: the engine holds it while its gateway holds calls at
  the door (a weight sync, or the train step that a prefetched rollout waits for), time the flow
  cannot use;
- while the rollout waits for a model call, it runs only while the model answers nobody: each
  call the engine's gateway answers (``ok``) shows the shared sampler working through its queue,
  and every rollout waiting on a call gets back the time it waited since the last answer. A
  rollout stuck in its own code, or waiting on a sampler that answers no one, is cut off.

The engine tells the clock about calls when its gateway runs in its own process (the default,
and each flow worker's own gateway); attached to an outside gateway, a deadline is wall time.
A sync flow cannot be force-killed in Python; when it misses its
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


class _Waiting:
    """A rollout's model calls in flight, and since when its wait has not been given back."""

    __slots__ = ("calls", "since")

    def __init__(self, since: float) -> None:
        self.calls = 0
        self.since = since


class DeadlineClock:
    """The running deadlines of one engine's rollouts, which count the time each was stalled.

    ``hold(True)`` takes every live deadline off the loop's timer, keeping the time each had
    left; ``hold(False)`` puts them back with that time. A rollout that starts while the clock is
    held gets its whole deadline when it is released. ``call(session_id, status)`` is the
    gateway's word on a model call: opened (``status`` None) or finished; a call answered
    ``ok`` gives every rollout waiting on a call the time it waited since the last answer (it was
    queued, not stalled). Called on the event loop's thread only.
    """

    def __init__(self) -> None:
        self.held = False
        self._left: dict[asyncio.Timeout, float | None] = {}  # seconds left, while held
        self._sessions: dict[str, asyncio.Timeout] = {}  # a rollout's gateway session -> its deadline
        self._waiting: dict[asyncio.Timeout, _Waiting] = {}  # rollouts with a model call in flight
        self.given_back_s = 0.0  # time given back to waiting rollouts (all of them together)

    def call(self, session_id: str, status: str | None) -> None:
        """A model call of ``session_id`` opened (``status`` None) or finished with ``status``."""
        now = asyncio.get_running_loop().time()
        if status == "ok":
            self._give_back(now)
        timeout = self._sessions.get(session_id)
        if timeout is None:  # not a rollout of this engine (or already ended)
            return
        waiting = self._waiting.get(timeout)
        if status is None:
            if waiting is None:
                waiting = self._waiting[timeout] = _Waiting(now)
            waiting.calls += 1
        elif waiting is not None:
            waiting.calls -= 1
            if waiting.calls <= 0:
                del self._waiting[timeout]

    def _give_back(self, now: float) -> None:
        """The sampler answered a call: the waits since its last answer were queueing."""
        if self.held:  # nothing runs; the release starts every wait afresh
            return
        for timeout, waiting in self._waiting.items():
            gained = now - waiting.since
            waiting.since = now
            when = timeout.when()
            if when is None or timeout.expired() or gained <= 0:
                continue
            timeout.reschedule(when + gained)
            self.given_back_s += gained

    def hold(self, held: bool) -> None:
        if held == self.held:
            return
        self.held = held
        now = asyncio.get_running_loop().time()
        for waiting in self._waiting.values():
            waiting.since = now  # time held is not counted, so it is not given back either
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

    def track(
        self, timeout: asyncio.Timeout, deadline_s: float | None, session_id: str | None = None
    ) -> None:
        self._left[timeout] = deadline_s
        if session_id is not None:
            self._sessions[session_id] = timeout
        if self.held:
            timeout.reschedule(None)

    def untrack(self, timeout: asyncio.Timeout, session_id: str | None = None) -> None:
        self._left.pop(timeout, None)
        self._waiting.pop(timeout, None)
        if session_id is not None and self._sessions.get(session_id) is timeout:
            del self._sessions[session_id]


async def call_with_deadline(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    *,
    is_async: bool,
    deadline_s: float | None,
    executor: Executor | None,
    clock: DeadlineClock | None = None,
    session_id: str | None = None,
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
                clock.track(timeout, deadline_s, session_id)
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
                    clock.untrack(timeout, session_id)
    except TimeoutError:
        if timeout.expired():
            raise DeadlineExceeded(f"exceeded its {deadline_s:g} s deadline") from None
        raise
