"""Step metrics of where rollouts ran: the sandbox acquire latency overall and per flow worker.

A worker pool (:mod:`rllm.engine.rollout.ray_executor`) names each episode's worker in
``metadata["rollout_worker"]``; the sandbox provider records ``sandbox_acquire_s`` and
``sandbox_warm`` per episode. A cold worker (its sandboxes acquired cold while others are warm)
shows as a slowest-worker figure far above the mean."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from rllm.types import Episode

WORKER_KEY = "rollout_worker"


def acquire_s_by_worker(episodes: Sequence[Episode]) -> dict[str, list[float]]:
    """Each worker's sandbox acquire latencies (seconds); ``""`` for episodes run in-process."""
    out: dict[str, list[float]] = {}
    for e in episodes:
        if "sandbox_acquire_s" in e.metrics:
            out.setdefault(str(e.metadata.get(WORKER_KEY, "")), []).append(e.metrics["sandbox_acquire_s"])
    return out


def sandbox_step_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """``sandbox/acquire_s`` (mean), ``sandbox/acquire_s_slowest_worker`` (the highest
    per-worker mean) and ``sandbox/warm`` (the fraction from a warm pool); empty when no episode
    had a sandbox."""
    by_worker = acquire_s_by_worker(episodes)
    if not by_worker:
        return {}
    latencies = [s for values in by_worker.values() for s in values]
    warm = [e.metrics["sandbox_warm"] for e in episodes if "sandbox_warm" in e.metrics]
    return {
        "sandbox/acquire_s": statistics.fmean(latencies),
        "sandbox/acquire_s_slowest_worker": max(statistics.fmean(v) for v in by_worker.values()),
        "sandbox/warm": statistics.fmean(warm) if warm else 0.0,
    }
