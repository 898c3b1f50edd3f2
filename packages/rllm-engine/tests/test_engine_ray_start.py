"""Starting a local Ray: a raylet that misses Ray's fixed 30 s start-up window is retried, any
other failure (and any failure of a cluster at an address) stands. ``RayStartup`` below is a
stand-in for the ``ray`` module's init/shutdown only (real start-ups: test_engine_ray_executor, and the verl backend's test_verl_ray_cluster)."""

from __future__ import annotations

from typing import Any

import pytest

from rllm.engine.rollout.ray_connect import RAY_START_TRIES, init_ray

TIMEOUT = Exception("The current node timed out during startup. This could happen because ...")


class RayStartup:
    """Fails ``init`` with the given errors in turn, then succeeds; records the calls."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls: list[str] = []

    def init(self, **kwargs: Any) -> None:
        self.calls.append("init")
        if self.errors:
            raise self.errors.pop(0)

    def shutdown(self) -> None:
        self.calls.append("shutdown")


def test_a_missed_startup_window_is_retried_after_a_shutdown() -> None:
    ray = RayStartup(TIMEOUT)
    init_ray(ray, address=None, num_cpus=2)
    assert ray.calls == ["init", "shutdown", "init"]


def test_the_startup_error_stands_after_the_last_try() -> None:
    ray = RayStartup(*([TIMEOUT] * RAY_START_TRIES))
    with pytest.raises(Exception, match="timed out during startup"):
        init_ray(ray, address=None)
    assert ray.calls.count("init") == RAY_START_TRIES


@pytest.mark.parametrize(
    ("error", "address"), [(RuntimeError("no GPUs"), None), (TIMEOUT, "ray://head:10001")]
)
def test_other_failures_and_remote_clusters_are_not_retried(error: Exception, address: str | None) -> None:
    ray = RayStartup(error)
    with pytest.raises(type(error)):
        init_ray(ray, address=address)
    assert ray.calls == ["init"]
