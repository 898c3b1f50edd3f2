"""Handing the sampler's answers to the event loops that wait for them, one wake-up per loop.

A decode step of a batch of short completions often ends many requests at once (a GRPO group's
rollouts). Answering each through its own ``concurrent.futures.Future`` wrapped by
``asyncio.wrap_future`` wakes the caller's loop once per request (``call_soon_threadsafe``: a
write to its self-pipe and a GIL hand-over each). The engine instead collects a step's answers
here and posts them in one callback per loop (:meth:`Outbox.flush`), which settles every
waiting future on that loop. A waiter cancelled meanwhile (its HTTP client went away, its task
was cancelled) is skipped there, so it never fails the others.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

# (the waiting future, its answer, the error that replaces it (None: the answer))
Delivery = tuple["asyncio.Future[Any]", Any, BaseException | None]


class Outbox:
    """Deliveries waiting for the end of a decode step. Used by the engine's thread only."""

    def __init__(self) -> None:
        self._by_loop: dict[asyncio.AbstractEventLoop, list[Delivery]] = {}

    def put(
        self,
        loop: asyncio.AbstractEventLoop,
        waiter: asyncio.Future[Any],
        value: Any,
        error: BaseException | None,
    ) -> None:
        self._by_loop.setdefault(loop, []).append((waiter, value, error))

    def flush(self) -> None:
        """Post every waiting delivery: one callback per loop."""
        if not self._by_loop:
            return
        pending, self._by_loop = self._by_loop, {}
        for loop, deliveries in pending.items():
            post(loop, deliveries)


def post(loop: asyncio.AbstractEventLoop, deliveries: Sequence[Delivery]) -> None:
    """Settle ``deliveries`` on ``loop`` (from any thread), in one callback."""
    # A closed loop has no one left waiting: its callers are gone with it.
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(settle, deliveries)


def settle(deliveries: Sequence[Delivery]) -> None:
    """On the waiters' loop: each not-yet-done waiter gets its answer or its error."""
    for waiter, value, error in deliveries:
        if waiter.done():  # cancelled by its caller meanwhile
            continue
        if error is not None:
            waiter.set_exception(error)
        else:
            waiter.set_result(value)
