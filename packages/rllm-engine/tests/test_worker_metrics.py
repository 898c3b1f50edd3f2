"""The step metrics of sandbox acquire latency, overall and per flow worker."""

from __future__ import annotations

import pytest

from rllm.engine.rollout.worker_metrics import WORKER_KEY, acquire_s_by_worker, sandbox_step_metrics
from rllm.engine.training.train_step import episode_metrics
from rllm.types import Episode


def _episode(worker: str | None, acquire_s: float | None, warm: float = 1.0) -> Episode:
    ep = Episode(task_id="t")
    if acquire_s is not None:
        ep.metrics.update(sandbox_acquire_s=acquire_s, sandbox_warm=warm)
    if worker is not None:
        ep.metadata[WORKER_KEY] = worker
    return ep


def test_a_cold_worker_shows_as_the_slowest_worker_above_the_mean() -> None:
    episodes = [
        _episode("ray-0@a", 0.001),
        _episode("ray-0@a", 0.003),
        _episode("ray-1@b", 0.5, warm=0.0),
        _episode("ray-1@b", 0.7, warm=0.0),
        _episode(None, None),  # a rollout without a sandbox counts in none of them
    ]
    assert acquire_s_by_worker(episodes) == {"ray-0@a": [0.001, 0.003], "ray-1@b": [0.5, 0.7]}
    metrics = episode_metrics(episodes)
    assert metrics["sandbox/acquire_s"] == pytest.approx(0.301)
    assert metrics["sandbox/acquire_s_slowest_worker"] == pytest.approx(0.6)
    assert metrics["sandbox/warm"] == pytest.approx(0.5)


def test_no_sandbox_metrics_without_sandboxes_and_in_process_rollouts_are_one_worker() -> None:
    assert sandbox_step_metrics([_episode(None, None)]) == {}
    assert "sandbox/acquire_s" not in episode_metrics([_episode(None, None)])
    local = sandbox_step_metrics([_episode(None, 0.2), _episode(None, 0.4)])
    assert local["sandbox/acquire_s"] == pytest.approx(0.3) == local["sandbox/acquire_s_slowest_worker"]
