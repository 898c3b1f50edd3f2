"""How late the event loop runs what is ready: the sign that rollouts queue for a busy process.

A timer is due every ``interval_s``; how late it runs is how long anything that became ready
waited for the loop: an LLM answer waiting to be read while other rollouts' code runs. In a
process with more agent traffic than one core carries (or one that a flow blocks with
synchronous code) this grows to tens or hundreds of milliseconds, and every LLM call of every
rollout in the process pays it. The engine stamps it on each Episode (``metrics["loop_lag_s"]``)
and warns once when it stays large, naming the two usual causes. Only ticks while rollouts run
count (a trainer's update between batches is not the rollouts' concern), and the warning needs
most recent ticks late, not one: the first use of a client library blocks once (openai imports
its resources lazily), and a sampler or trainer sharing the process delays the loop now and then
without the flows being the bottleneck (the main job's figures: benchmarks/history/issue-06.md,
"The main job").
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)  # rllm.engine.rollout.loop_lag: `rllm train` keeps it off the terminal

# A tick this late is a "late tick": far above what a healthy loop shows (well under 10 ms).
WARN_LAG_S = 0.1
# The engine warns when this many of the last ``window`` ticks while rollouts ran were late.
WARN_LATE_TICKS = 5


class LoopLagMonitor:
    """Tracks the worst lateness of a periodic timer over the last ``window`` ticks that came
    while ``busy()`` was true (default: always)."""

    def __init__(
        self, interval_s: float = 0.1, window: int = 10, busy: Callable[[], bool] | None = None
    ) -> None:
        self.interval_s = interval_s
        self._busy = busy or (lambda: True)
        self._recent: collections.deque[float] = collections.deque(maxlen=window)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0
        self._warned = False

    def start(self) -> None:
        """Start ticking on the running loop (idempotent)."""
        if self._handle is None:
            self._loop = asyncio.get_running_loop()
            self._schedule()

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _schedule(self) -> None:
        assert self._loop is not None
        self._due = self._loop.time() + self.interval_s
        self._handle = self._loop.call_at(self._due, self._tick)

    def _tick(self) -> None:
        assert self._loop is not None
        if self._busy():
            self._recent.append(self._loop.time() - self._due)
        self._schedule()

    @property
    def lag_s(self) -> float:
        """The worst lateness seen recently, counting a tick that is overdue right now (code
        that has held the loop since it was due)."""
        if self._loop is None:
            return 0.0
        overdue = self._loop.time() - self._due if self._handle is not None and self._busy() else 0.0
        return max(0.0, overdue, *self._recent)

    @property
    def late_ticks(self) -> int:
        """How many of the recent ticks were later than :data:`WARN_LAG_S`."""
        return sum(late > WARN_LAG_S for late in self._recent)

    def check(self) -> float:
        """The current lag; once :data:`WARN_LATE_TICKS` of the recent ticks were late, a warning
        (one) that says what usually causes it and what to change."""
        lag = self.lag_s
        late = self.late_ticks
        if late >= WARN_LATE_TICKS and not self._warned:
            self._warned = True
            log.warning(
                "the event loop running rollouts was late by more than %.0f ms in %d of its last "
                "%d checks (now %.0f ms): every LLM call in this process waits that long. Either the "
                "process is CPU-bound (raise rollout.workers, i.e. "
                "RolloutConfig.workers, to spread the flows over more processes, up to the cores, "
                "or lower the concurrency), or a flow blocks the loop with synchronous code (make "
                "it a sync flow, which runs in a thread, or move the blocking part to "
                "asyncio.to_thread).",
                WARN_LAG_S * 1e3,
                late,
                len(self._recent),
                lag * 1e3,
            )
        return lag
