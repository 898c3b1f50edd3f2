"""rollout.executor: its default keeps the behaviour from before the key, and contradictions are
refused when the config is built (before any worker or Ray starts)."""

from __future__ import annotations

import pytest

from rllm.engine.rollout.executors import RaySettings, resolve_executor
from rllm.engine.rollout.rollout_config import RolloutConfig, RolloutSettings
from rllm.types import InvariantError, convert


def test_unset_means_processes_for_several_workers_else_local() -> None:
    assert resolve_executor(None, 1) == "local"
    assert resolve_executor(None, 4) == "processes"
    assert resolve_executor("ray", 1) == "ray"
    assert resolve_executor(RolloutConfig().executor, RolloutConfig().workers) == "local"


@pytest.mark.parametrize(
    ("settings", "blamed"),
    [
        ({"executor": "slurm"}, "executor"),
        ({"executor": "local", "workers": 2}, "workers"),
        ({"executor": "ray", "ray": {"num_workers": 0}}, "num_workers"),
        ({"executor": "ray", "ray": {"resources_per_worker": {"CPU": -1}}}, "resources_per_worker"),
        ({"executor": "ray", "ray": {"adress": "x"}}, "adress"),
    ],
)
def test_contradictions_are_refused_naming_the_key(settings: dict, blamed: str) -> None:
    with pytest.raises(Exception) as info:
        convert(settings, RolloutSettings)
    assert blamed in str(info.value)


def test_ray_settings_from_a_config_section() -> None:
    s = convert(
        {
            "executor": "ray",
            "ray": {
                "address": "10.0.0.1:6379",
                "num_workers": 8,
                "resources_per_worker": {"CPU": 2, "sandbox": 1},
            },
        },
        RolloutSettings,
    )
    assert s.ray == RaySettings(
        address="10.0.0.1:6379", num_workers=8, resources_per_worker={"CPU": 2.0, "sandbox": 1.0}
    )
    with pytest.raises(InvariantError):
        RolloutConfig(executor="local", workers=3)
