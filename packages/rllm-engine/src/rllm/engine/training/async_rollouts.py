"""AsyncRollouts: keep groups of rollouts running while the trainer trains, within a window.

At most ``window`` groups are outstanding at once (running, or finished and not yet released by
the trainer); a slot frees only when the trainer releases its group, after the weight sync that
follows its use (or at once when the group is dropped or re-queued as stale). With
``window = (K + 1) * tasks_per_step`` a group usually starts at most K syncs before the update
that uses it; the trainer still checks every group's real oldest weight version (rollouts finish
in any order), so the bound is enforced, not hoped for.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import NamedTuple

from rllm.types import Episode, Task


class FinishedGroup(NamedTuple):
    seq: int  # dispatch order: the trainer sorts its batch by it, as the synchronous loop orders tasks
    task: Task
    episodes: list[Episode]


class AsyncRollouts:
    """Runs ``run_group(seq, task)`` for tasks from ``next_task`` (after ``pending``, e.g. the tasks
    a checkpoint left unconsumed), ``parallel`` groups at a time, ``window`` outstanding at most;
    ``seq`` numbers the groups in the order they were handed out, from 0."""

    def __init__(
        self,
        run_group: Callable[[int, Task], Awaitable[list[Episode]]],
        next_task: Callable[[], Task],
        *,
        window: int,
        parallel: int,
        pending: Sequence[Task] = (),
    ) -> None:
        self._run_group = run_group
        self._next_task = next_task
        self._window = window
        self._parallel = asyncio.Semaphore(max(1, parallel))
        self._retry: deque[Task] = deque(pending)
        self._outstanding: dict[int, Task] = {}
        self._running: dict[int, asyncio.Task[None]] = {}
        self._finished: asyncio.Queue[FinishedGroup | BaseException] = asyncio.Queue()
        self._room = asyncio.Event()
        self._seq = 0
        self._dispatcher: asyncio.Task[None] | None = None
        # Utilisation: wall time with at least one group running.
        self._busy_groups = 0
        self._busy_since = 0.0
        self._busy_s = 0.0

    def start(self) -> None:
        self._room.set()
        self._dispatcher = asyncio.create_task(self._dispatch())

    async def _dispatch(self) -> None:
        try:
            while True:
                await self._room.wait()
                while len(self._outstanding) < self._window:
                    task = self._retry.popleft() if self._retry else self._next_task()
                    seq, self._seq = self._seq, self._seq + 1
                    self._outstanding[seq] = task
                    self._running[seq] = asyncio.create_task(self._one(seq, task))
                self._room.clear()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # e.g. no task left to hand out: the trainer raises it
            self._finished.put_nowait(exc)

    async def _one(self, seq: int, task: Task) -> None:
        try:
            async with self._parallel:
                self._mark_busy(+1)
                try:
                    episodes = await self._run_group(seq, task)
                finally:
                    self._mark_busy(-1)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a bug in the rollout path must stop training, not hang it
            self._finished.put_nowait(exc)
            return
        finally:
            self._running.pop(seq, None)
        self._finished.put_nowait(FinishedGroup(seq, task, episodes))

    def _mark_busy(self, delta: int) -> None:
        now = time.perf_counter()
        if self._busy_groups > 0:
            self._busy_s += now - self._busy_since
        self._busy_since = now
        self._busy_groups += delta

    async def next_group(self) -> FinishedGroup:
        """The next group to finish (any order); re-raises an error of the rollout path."""
        item = await self._finished.get()
        if isinstance(item, BaseException):
            raise item
        return item

    def release(self, seq: int, *, requeue: bool = False) -> None:
        """The trainer is done with group ``seq``: its slot frees; ``requeue`` runs its task again."""
        task = self._outstanding.pop(seq)
        if requeue:
            self._retry.append(task)
        self._room.set()

    def unconsumed(self) -> list[Task]:
        """Tasks handed out but not yet consumed (outstanding, then re-queued), for a checkpoint."""
        return [self._outstanding[s] for s in sorted(self._outstanding)] + list(self._retry)

    def busy_seconds(self) -> float:
        """Wall seconds so far with at least one group running."""
        extra = time.perf_counter() - self._busy_since if self._busy_groups > 0 else 0.0
        return self._busy_s + extra

    @property
    def running(self) -> int:
        return len(self._running)

    async def close(self) -> None:
        tasks = [t for t in (self._dispatcher, *self._running.values()) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._dispatcher = None
