"""The local sampler's queue: which requests start a batch, which join the running one, and which
an ``abort_all`` or its caller's going away (``cancel``) ends.

Requests wait in a thread-safe queue; the engine's thread takes the next batch from it
(:meth:`RequestQueue.next_batch`) and, at each decode step of that batch, the text requests that
fit beside it (:meth:`RequestQueue.joiners`). A request that does not fit waits at the head of
the line (``carry``), so arrival order is kept. The requests an event loop submits in one of its
iterations reach the queue together when that iteration ends, so they start one batch.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable

from rllm.backends.tinker.local.generation_types import Pending, has_pixels
from rllm.types.errors import StateError


class RequestQueue:
    """Submitted requests until the engine's thread takes them; ``None`` in the queue stops it."""

    def __init__(self) -> None:
        self._queue: queue.Queue[Pending | None] = queue.Queue()
        self._carry: list[Pending] = []  # taken from the queue, not yet in a batch (engine thread)
        # submit_async's requests of each caller loop's current iteration, handed to the queue
        # together when that iteration ends (each list is touched only by its loop's thread).
        self._loop_buffers: dict[asyncio.AbstractEventLoop, list[Pending]] = {}
        self.closed = False
        self.aborts = 0  # abort_all calls so far; the engine reads it at each decode step
        self.cancels = 0  # requests whose caller went away, so far (read there too)
        self._abort_lock = threading.Lock()

    # submitting --------------------------------------------------------------------------------
    def put(self, p: Pending) -> None:
        self._queue.put(p)

    def put_from_loop(self, p: Pending, loop: asyncio.AbstractEventLoop) -> None:
        """Queue ``p`` (on ``loop``'s thread) when ``loop``'s current iteration ends."""
        buffer = self._loop_buffers.get(loop)
        if buffer is None:
            buffer = self._loop_buffers[loop] = []
            loop.call_soon(self._hand_over, loop)  # runs after this iteration's callbacks
        buffer.append(p)

    def _hand_over(self, loop: asyncio.AbstractEventLoop) -> None:
        """On ``loop``: its buffered requests go to the queue."""
        for p in self._loop_buffers.pop(loop, []):
            if not self.closed:
                self._queue.put(p)
            elif p.waiter is not None and not p.waiter.done():  # nobody else would answer it
                p.settled = True
                p.waiter.set_exception(StateError("sampler engine stopped before this request ran"))

    def queued(self) -> int:
        """Requests in the queue (not counting those already taken from it)."""
        return self._queue.qsize()

    def waiting(self) -> int:
        """Requests submitted, not yet decoding and still wanted: the queue, the head of the line,
        and what the callers' loops hand over at the end of their iteration (approximate off the
        engine thread). A request whose caller went away no longer counts."""
        with self._queue.mutex:
            queued = sum(1 for p in self._queue.queue if p is not None and not p.cancelled)
        others = [*self._carry, *(p for b in list(self._loop_buffers.values()) for p in b)]
        return queued + sum(1 for p in others if not p.cancelled)

    def close(self) -> None:
        """Refuse new requests; the engine's thread stops after its running batch."""
        self.closed = True
        self._queue.put(None)

    def drain(self) -> list[Pending]:
        """Every request still waiting (after the engine's thread stopped)."""
        leftovers = list(self._carry)
        self._carry.clear()
        while not self._queue.empty():
            item = self._queue.get_nowait()
            if item is not None:
                leftovers.append(item)
        return leftovers

    # aborting ----------------------------------------------------------------------------------
    def abort_all(self) -> None:
        """Every request submitted before now counts as aborted (:meth:`aborted`)."""
        with self._abort_lock:
            self.aborts += 1

    def cancel(self, p: Pending) -> None:
        """``p``'s caller went away: it ends at the next decode step (or before it starts)."""
        if not p.settled and not p.cancelled:
            p.cancelled = True
            with self._abort_lock:
                self.cancels += 1

    def aborted(self, p: Pending) -> bool:
        return p.epoch < self.aborts or p.cancelled

    # taking (engine thread) --------------------------------------------------------------------
    def next_batch(self, max_batch: int, window_s: float) -> list[Pending] | None:
        """Everything queued now, up to ``max_batch`` sequences; blocks only while nothing waits;
        None once the queue is closed.

        Once a request is in hand, requests keep being collected while they arrive less than
        ``window_s`` apart: concurrent clients (a group of rollouts) rarely hit the queue at the
        same instant, and one batch of 32 rows costs about what a batch of 8 does.
        """
        batch: list[Pending] = []
        rows = 0
        if not self._carry:
            first = self._queue.get()
            if first is None:
                return None
            self._carry.append(first)
        while True:
            while self._carry:
                p = self._carry[0]
                if batch and rows + p.request.n > max_batch:
                    return batch
                batch.append(self._carry.pop(0))
                rows += p.request.n
            try:
                item = self._queue.get(timeout=window_s) if window_s > 0 else self._queue.get_nowait()
            except queue.Empty:
                return batch
            if item is None:
                self._queue.put(None)  # stop after this batch
                return batch
            self._carry.append(item)

    def joiners(self, room: int, swaps_waiting: Callable[[], int]) -> list[Pending]:
        """Queued text requests that fit in ``room`` more rows, in arrival order; none while a
        weight swap waits (``swaps_waiting``: it would otherwise wait for the joiners too)."""
        joiners: list[Pending] = []
        while not swaps_waiting():
            if not self._carry:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._queue.put(None)  # stop after this batch
                    break
                self._carry.append(item)
            p = self._carry[0]
            if p.request.n > room or has_pixels(p.request.vision):
                break  # it starts the next batch (order is kept)
            joiners.append(self._carry.pop(0))
            room -= p.request.n
        return joiners
