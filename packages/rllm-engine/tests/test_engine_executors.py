"""rollout.executor: its default keeps the behaviour from before the key, contradictions are
refused when the config is built (before any worker or Ray starts), and executors are one
registry (built-ins, in-process registrations and installed entry points alike)."""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from rllm.engine.rollout.executors import (
    BUILTIN_EXECUTORS,
    ExecutorSpec,
    PoolRequest,
    RaySettings,
    available_executors,
    get_executor,
    refresh_plugins,
    register_executor,
    resolve_executor,
    unregister_executor,
)
from rllm.engine.rollout.rollout_config import RolloutConfig, RolloutSettings
from rllm.engine.rollout.rollout_engine import RolloutEngine
from rllm.engine.rollout.worker_pool import FlowProcessDied, SlottedPool, WorkerHandle, WorkerSlots
from rllm.gateway import GatewayGroup
from rllm.types import AgentConfig, Episode, InvariantError, Task, TerminationReason, convert
from rllm.types.errors import InputError, LookupFailed, StateError, UsageError


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
        # a remote run without URLs is refused for the URLs, even with a cookbook's workers = 2
        ({"executor": "remote", "workers": 2}, "remote.urls"),
        ({"executor": "remote", "workers": 2, "remote": {"urls": ["http://h:1"]}}, "workers=1"),
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


# ----------------------------------------------------------------------------- the registry
def test_an_unknown_executor_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(InvariantError) as err:
        RolloutSettings(executor="slurm")
    assert err.value.field == "executor"
    assert "'local', 'processes', 'ray', 'remote'" in str(err.value) and "'slurm'" in str(err.value)
    with pytest.raises(LookupFailed, match=r"unknown executor 'slurm'; known: local, processes, ray, remote"):
        get_executor("slurm")


def test_the_built_ins_are_registered_as_a_plugin_registers_its_own() -> None:
    assert set(BUILTIN_EXECUTORS) == {"local", "processes", "ray", "remote"} <= available_executors()
    assert [get_executor(n).in_process for n in ("local", "remote", "processes", "ray")] == [
        True,
        True,
        False,
        False,
    ]
    # A pool is named by its path until first started: naming "ray" never imports Ray.
    assert get_executor("ray").pool == "rllm.engine.rollout.ray_executor:start_ray_pool"
    from rllm.engine.rollout.flow_processes import start_process_pool

    assert get_executor("processes").load_pool() is start_process_pool
    with pytest.raises(InputError, match="already registered"):
        register_executor(ExecutorSpec("local"))
    with pytest.raises(InputError, match="not both"):
        ExecutorSpec("both", pool="m:f", flow=lambda settings, flow: flow)


def test_a_registered_executor_s_own_check_refuses_its_settings() -> None:
    def needs_two(settings: Any) -> None:
        if settings.workers < 2:
            raise InvariantError("executor 'pairs' needs workers >= 2", "workers")

    register_executor(ExecutorSpec("pairs", pool="unused:start", check=needs_two))
    try:
        with pytest.raises(InvariantError, match="needs workers >= 2"):
            RolloutSettings(executor="pairs")
        assert RolloutSettings(executor="pairs", workers=2).workers == 2
        with pytest.raises(InvariantError, match="'pairs'"):  # listed among the known ones
            RolloutSettings(executor="nope")
    finally:
        unregister_executor("pairs")


class InlinePool(SlottedPool[WorkerHandle]):
    """A worker pool whose workers are engines in this process: the shape a plugin's pool takes
    (its slot accounting is the shared WorkerSlots, its workers engines built by the factory)."""

    def __init__(self, request: PoolRequest) -> None:
        settings = request.settings
        self.request = request
        self.slots: WorkerSlots[WorkerHandle] = WorkerSlots(
            settings.workers, settings.concurrency, settings.worker_prefetch
        )
        self.engines: list[Any] = []

    async def start(self) -> InlinePool:
        for i in range(len(self.slots.shares)):
            kwargs = self.slots.engine_kwargs(self.request.engine_kwargs, i)
            engine = await self.request.engine(**kwargs).start()
            self.engines.append(engine)
            worker = WorkerHandle(i, self.slots.capacity_of(i))
            worker.gateway_url = engine.gateway_url
            self.slots.workers.append(worker)
        return self

    async def run_one(
        self, task: Task, rollout_index: int, is_validation: bool, model: str, sampling: Any = None
    ) -> Episode:
        w, job_id, fut = self.slots.take(lambda: FlowProcessDied("no inline worker left"))
        episode = await self.engines[w.index].run_one(
            task, rollout_index, is_validation, model=model, sampling=sampling
        )
        episode.metadata["rollout_worker"] = f"inline-{w.index}"
        w.resolve(job_id, episode)
        return await fut

    async def close(self) -> None:
        for engine in self.engines:
            await engine.close()


async def start_inline_pool(request: PoolRequest) -> InlinePool:
    return await InlinePool(request).start()


async def two_calls(task: Task, config: AgentConfig) -> None:
    async with httpx.AsyncClient(
        base_url=config.base_url, headers={"Authorization": f"Bearer {config.api_key}"}
    ) as c:
        for turn in range(2):
            body = {"model": config.model, "messages": [{"role": "user", "content": f"{turn} #{task.id}"}]}
            (await c.post("/chat/completions", json=body)).raise_for_status()
    return None


async def test_a_plugin_executor_runs_rollouts_through_the_registry(upstream) -> None:
    register_executor(ExecutorSpec("inline-test", pool=start_inline_pool))
    try:
        config = RolloutConfig(executor="inline-test", workers=2, concurrency=4, n=2, progress=False)
        async with RolloutEngine(two_calls, None, config, upstreams=[upstream.url]) as engine:
            pool = engine._pool
            assert isinstance(pool, InlinePool)
            assert isinstance(engine.client, GatewayGroup) and len(set(pool.gateway_urls)) == 2
            episodes = await engine.run([Task(id=f"t{i}", instruction="hi") for i in range(4)])
    finally:
        unregister_executor("inline-test")
    assert [ep.termination_reason for ep in episodes] == [TerminationReason.DONE] * 8
    assert all(len(ep.trajectories[0].steps) == 2 for ep in episodes)  # both calls, from the traces
    assert {ep.metadata["rollout_worker"] for ep in episodes} == {"inline-0", "inline-1"}
    # Each worker engine ran its share, on its own gateway, from the driver's config.
    assert [e.config.concurrency for e in pool.engines] == [2, 2]
    assert {e.config.executor for e in pool.engines} == {"local"}


def test_an_installed_entry_point_is_found_by_name(tmp_path, monkeypatch) -> None:
    """A package installed with ``[project.entry-points."rllm.executors"]`` (its dist-info on
    sys.path, found by importlib.metadata as pip's would be) is an executor by that name."""
    (tmp_path / "rllm_executor_plugin_test.py").write_text(
        "from rllm.engine.rollout.executors import ExecutorSpec\n"
        "EXECUTOR = ExecutorSpec('from-entry-point', pool='rllm_executor_plugin_test:start')\n"
    )
    info = tmp_path / "rllm_executor_plugin_test-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rllm-executor-plugin-test\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[rllm.executors]\nfrom-entry-point = rllm_executor_plugin_test:EXECUTOR\n"
        "broken = rllm_executor_plugin_test:ExecutorSpec\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    refresh_plugins()
    try:
        assert {"from-entry-point", "broken"} <= available_executors()
        assert RolloutSettings(executor="from-entry-point", workers=3).workers == 3
        assert get_executor("from-entry-point").pool == "rllm_executor_plugin_test:start"
        with pytest.raises(UsageError, match="not the ExecutorSpec of 'broken'"):
            get_executor("broken")
    finally:
        unregister_executor("from-entry-point")
        monkeypatch.undo()
        refresh_plugins()
    assert "from-entry-point" not in available_executors()


def test_the_capability_matrix_reads_the_registry(monkeypatch) -> None:
    from rllm.engine import capabilities
    from rllm.engine.rollout import executors

    flows = [row for section, row, _ in capabilities.probes() if section == "execution flow"]
    assert flows == ["regular", "sandboxed", "command", "remote", "ray"]
    assert capabilities._flow("ray")(None)
    monkeypatch.delitem(executors._EXECUTORS, "ray")  # a build without it
    assert not capabilities._flow("ray")(None)


def test_a_ray_address_nobody_answers_at_is_refused_naming_it() -> None:
    """Ray alone retries such an address without end; the executor tries it first, with a deadline."""
    from rllm.engine.rollout.ray_connect import check_address_answers

    with socket.socket() as probe:  # a port bound but not listening: a connection is refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        with pytest.raises(StateError, match=rf"rollout.ray.address '127.0.0.1:{port}' does not answer"):
            check_address_answers(f"127.0.0.1:{port}", 5.0)
    with socket.socket() as server:  # one that listens answers, with or without ray://
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        check_address_answers(f"127.0.0.1:{port}", 5.0)
        check_address_answers(f"ray://127.0.0.1:{port}", 5.0)


_UV_HOOK_PROBE = """
import ray._private.worker as worker
before = worker._maybe_modify_runtime_env(None, False)
from rllm.engine.rollout.ray_connect import _disable_ray_uv_hook
_disable_ray_uv_hook()
after = worker._maybe_modify_runtime_env(None, False)
print("hooked" if "py_executable" in (before or {}) else "not-hooked", sorted(after or {}))
"""


@pytest.mark.skipif(shutil.which("uv") is None, reason="needs uv on PATH (CI installs it)")
def test_ray_workers_run_in_the_driver_s_interpreter_under_uv_run(tmp_path) -> None:
    """A driver started by `uv run` (as the README's commands are): Ray's own uv hook would start
    each worker with `uv run` in a copy of the working folder (a new virtualenv per node, workers
    without Ray); the executor turns it off, so the runtime environment stays the driver's."""
    script = tmp_path / "probe.py"
    script.write_text(_UV_HOOK_PROBE)
    root = Path(__file__).resolve().parents[3]
    out = subprocess.run(
        ["uv", "run", "--no-sync", "--project", str(root), "python", str(script)],
        capture_output=True,
        text=True,
        check=True,
        cwd=root,
    ).stdout.split()
    assert out == ["hooked", "[]"], out  # the hook was live under `uv run`, and is off after
