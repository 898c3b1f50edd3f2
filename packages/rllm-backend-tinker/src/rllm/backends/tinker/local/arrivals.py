"""How long a new batch of the local sampler keeps collecting requests (its arrival gap).

A GRPO step's calls reach the sampler one by one, as fast as their senders produce them: over
HTTP the gateway fires them off quickly (gaps of ~0.1 ms), but a gateway in this process
(``sampler_in_process``) hands each over as its loop gets to the flow that made it, after that
flow's client work (gaps of 1–5 ms on a busy CPU). A fixed 1 ms gap then starts a batch with the
first few calls and the rest join it one decode step at a time, each join a forward pass more.

So the gap adapts: a multiple of the median gap between *concurrent* arrivals (a request that
arrives while another is still unanswered), never below the configured base, never above a cap,
and the whole collection is bounded. A lone client that sends its next request only after the
last answer records no gaps, so its requests keep starting after the base gap.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import deque
from collections.abc import Callable

# The gap waited is this many times the median concurrent gap: arrivals jitter around it.
GAP_FACTOR = 2.0
# At most this long between two arrivals (a decode step of a small model is ~1-3 ms on a CPU; a
# request waiting longer than a few steps' time costs more than the pass it saves).
MAX_GAP_S = 0.008
# A batch starts at the latest this long after its first request arrived.
MAX_COLLECT_S = 0.05
_SAMPLES = 64  # recent concurrent gaps kept (a step's worth of calls)


class ArrivalGap:
    """Thread-safe: ``arrived`` and ``answered`` are called by submitters and the engine thread."""

    def __init__(self, base_s: float, clock: Callable[[], float] = time.perf_counter) -> None:
        self.base_s = base_s
        self._clock = clock
        self._lock = threading.Lock()
        self._unanswered = 0
        self._last_arrival = 0.0
        self._gaps: deque[float] = deque(maxlen=_SAMPLES)

    def arrived(self) -> float:
        """Record a request's arrival; returns its time (by the clock, ``time.perf_counter``)."""
        now = self._clock()
        with self._lock:
            if self._unanswered:
                self._gaps.append(now - self._last_arrival)
            self._unanswered += 1
            self._last_arrival = now
        return now

    def answered(self) -> None:
        """A request got its answer (or its failure)."""
        with self._lock:
            self._unanswered = max(0, self._unanswered - 1)

    def gap_s(self) -> float:
        """The gap a collecting batch waits for its next request now (0: take what is queued)."""
        if self.base_s <= 0:
            return 0.0
        with self._lock:
            gaps = list(self._gaps)
        if not gaps:
            return self.base_s
        return min(MAX_GAP_S, max(self.base_s, GAP_FACTOR * statistics.median(gaps)))

    def collect_until(self, first_arrival: float) -> float:
        """When a batch whose first request arrived at ``first_arrival`` stops collecting."""
        return first_arrival + max(self.base_s, MAX_COLLECT_S)
