"""How late the event loop runs what is ready: the sign that rollouts queue for a busy process.

A timer is due every ``interval_s``; how late it runs is how long anything that became ready
waited for the loop: an LLM answer waiting to be read while other rollouts' code runs. In a
process with more agent traffic than one core carries (or one that a flow blocks with
synchronous code) this grows to tens or hundreds of milliseconds, and every LLM call of every
rollout in the process pays it. The engine stamps it on each Episode (``metrics["loop_lag_s"]``)
and warns once when it is large, naming the two usual causes.
"""

from __future__ import annotations

import asyncio
import collections
import logging

log = logging.getLogger("rllm.engine")

# Lag at which the engine warns: far above what a healthy loop shows (well under 10 ms).
WARN_LAG_S = 0.1


class LoopLagMonitor:
    """Tracks the worst lateness of a periodic timer over the last ``window`` ticks."""

    def __init__(self, interval_s: float = 0.1, window: int = 10) -> None:
        self.interval_s = interval_s
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
        self._recent.append(self._loop.time() - self._due)
        self._schedule()

    @property
    def lag_s(self) -> float:
        """The worst lateness seen recently, counting a tick that is overdue right now (code
        that has held the loop since it was due)."""
        if self._loop is None:
            return 0.0
        overdue = self._loop.time() - self._due if self._handle is not None else 0.0
        return max(0.0, overdue, *self._recent)

    def check(self) -> float:
        """The current lag; the first time it exceeds :data:`WARN_LAG_S`, a warning that says
        what usually causes it and what to change."""
        lag = self.lag_s
        if lag > WARN_LAG_S and not self._warned:
            self._warned = True
            log.warning(
                "the event loop running rollouts is %.0f ms late: every LLM call in this process "
                "waits that long. Either the process is CPU-bound (raise rollout.workers, i.e. "
                "RolloutConfig.workers, to spread the flows over more processes, up to the cores, "
                "or lower the concurrency), or a flow blocks the loop with synchronous code (make "
                "it a sync flow, which runs in a thread, or move the blocking part to "
                "asyncio.to_thread).",
                lag * 1e3,
            )
        return lag
