"""`rllm train say rollout.executor=ray` end to end: no Ray address, so the run starts a local Ray
instance, runs its rollouts in Ray actors (each with its own gateway) and shuts Ray down."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from rllm.cli.main import main
from rllm.engine.training.metrics_log import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.ray]


def test_rllm_train_say_on_a_local_ray(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ray = pytest.importorskip("ray")
    # Workers run this venv's Python: under `uv run` Ray would rebuild the workspace per worker.
    monkeypatch.setenv("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    # Ray read that variable at import (maybe before this test): set its switch here too, or under
    # `uv run … nox` its hook would start the workers with nox's command line.
    from ray._private import ray_constants

    monkeypatch.setattr(ray_constants, "RAY_ENABLE_UV_RUN_RUNTIME_ENV", False)
    out = tmp_path / "run"
    args = ["train", "say", "--out", str(out), "total_steps=3", "rollout.executor=ray"]
    quick = ["rollout.ray.num_workers=2", "tasks_per_step=2", "group_size=2", "val_every=0"]
    assert main([*args, *quick, "progress=false", "plot=false", "tensorboard=false", "sample_groups=1"]) == 0
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["termination/done"] == 1.0 and r["episodes"] == 4 for r in rows), rows
    assert all(r["rollout/worker_lost"] == 0 for r in rows)
    assert not ray.is_initialized()  # the Ray it started is shut down with the run


def test_relative_paths_reach_the_ray_workers_resolved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the README runs it: the default relative run folder (`runs/say`) and a relative model
    folder, from a working directory the Ray workers do not start in. The run is given a
    job-level working_dir as `ray job submit --working-dir` gives one (and Ray's uv hook gives
    the project), so its workers start in a copy of another folder in Ray's session: every path
    must leave the driver resolved, or a worker reads `runs/say/...` or `models/tiny` against its
    own folder (or as a hub name)."""
    pytest.importorskip("ray")
    monkeypatch.setenv("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    from ray._private import ray_constants

    monkeypatch.setattr(ray_constants, "RAY_ENABLE_UV_RUN_RUNTIME_ENV", False)
    driver, elsewhere = tmp_path / "driver", tmp_path / "workers-start-here"
    driver.mkdir()
    elsewhere.mkdir()
    stamp = f"the Ray workers' working_dir for {tmp_path}"
    (elsewhere / "README").write_text(stamp)
    monkeypatch.chdir(driver)
    assert main(["model", "init-tiny", "models/tiny", "--cookbook", "say"]) == 0
    # What a Ray job submitted with --working-dir runs under (ray.init reads it).
    monkeypatch.setenv(
        "RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps({"runtime_env": {"working_dir": str(elsewhere)}})
    )
    args = ["train", "say", "total_steps=2", "rollout.executor=ray", "backend.options.model=models/tiny"]
    quick = ["rollout.ray.num_workers=1", "tasks_per_step=2", "group_size=2", "val_every=0"]
    assert main([*args, *quick, "progress=false", "plot=false", "tensorboard=false", "sample_groups=1"]) == 0
    rows = read_metrics(driver / "runs" / "say" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["termination/done"] == 1.0 and r["episodes"] == 4 for r in rows), rows
    # The workers did start elsewhere: Ray unpacked the working_dir into its session for them.
    sessions = Path(tempfile.gettempdir()) / "ray"
    copies = sessions.glob("session_*/runtime_resources/working_dir_files/*/README")
    assert any(p.read_text() == stamp for p in copies), "Ray did not start the workers in the working_dir"
