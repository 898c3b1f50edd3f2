"""The ``ray`` executor on a real two-node Ray cluster on loopback: ``ray start --head`` and a
second ``ray start --address``, each with its own temp dir, started and stopped by this module
(by process group). Flows talk to a real loopback upstream through each worker's own gateway."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rllm.engine.plugins import load_cookbook
from rllm.engine.rollout.executors import RaySettings
from rllm.engine.rollout.rollout_config import RolloutConfig
from rllm.engine.rollout.rollout_engine import RolloutEngine
from rllm.engine.rollout.worker_metrics import acquire_s_by_worker
from rllm.engine.training.train_step import episode_metrics
from rllm.testing import MockReply, MockUpstream
from rllm.types import ConfigError, Episode, TerminationReason

pytestmark = [pytest.mark.slow, pytest.mark.ray]

needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None or shutil.which("prlimit") is None,
    reason="bubblewrap (bwrap) and prlimit are not installed: apt-get install bubblewrap",
)

ray = pytest.importorskip("ray")

# The workers import the flow by name: it lives in a module on the PYTHONPATH of both nodes.
FLOWS = """
import asyncio
import os
from pathlib import Path

if os.environ.get("RLLM_TEST_BREAK_IMPORT"):  # a worker started with a runtime_env that sets it
    raise ImportError("rllm_ray_flows cannot be imported on this worker")

import openai

from rllm.sdk import rollout


def _first_to_claim(marker):
    # O_EXCL makes the claim atomic: when two workers run t0 at once only one of them dies.
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


@rollout
async def two_turns(task, config):
    marker = config.metadata.get("die_once")
    if marker and task.id == "t0" and _first_to_claim(marker):
        os._exit(3)  # this node's worker process dies mid-rollout
    return await _chat(task, config)


@rollout
async def held(task, config):
    # Writes a marker and waits forever (on every node, or only on the node started with
    # RLLM_TEST_NODE=victim); a cancellation it receives leaves a ".cancelled" marker.
    hold = config.metadata.get("hold_dir")
    here = config.metadata.get("hold_on") in (None, os.environ.get("RLLM_TEST_NODE"))
    if hold and here:
        marker = Path(hold, f"{task.id}-{config.metadata['rollout_index']}-{os.getpid()}")
        marker.write_text(os.environ.get("RLLM_TEST_NODE", ""))
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            marker.with_suffix(".cancelled").write_text("")
            raise
    return await _chat(task, config)


async def _chat(task, config):
    client = openai.AsyncOpenAI(base_url=config.base_url, api_key=config.api_key, max_retries=0)
    messages = [{"role": "user", "content": f"{task.instruction} #{task.id}"}]
    for turn in range(2):
        reply = await client.chat.completions.create(model=config.model, messages=messages)
        messages += [reply.choices[0].message.model_dump(exclude_none=True),
                     {"role": "user", "content": f"go on {turn} #{task.id}"}]
    await client.close()
    return {"model": config.model}
"""

RAY_START_WINDOW_S = 480.0  # both nodes, retries included; a loaded 2-core CI machine is slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    ray_cli = str(Path(sys.executable).with_name("ray"))
    common = ["--node-ip-address=127.0.0.1", "--num-cpus=1", "--disable-usage-stats", "--block"]
    with log.open("wb") as out:
        # Its own process group: teardown ends exactly the processes this node started. Not its own
        # session: with the kernel's autogroup scheduling a new session is one scheduling entity,
        # so a whole node (a raylet and six Python services booting at once) would share one
        # process's CPU share on a loaded machine, and its raylet gives the dashboard agent a
        # fixed 15 s to write its port file before it aborts.
        return subprocess.Popen(
            [ray_cli, "start", *args, *common],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            process_group=0,
        )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=20)
            return
        except subprocess.TimeoutExpired:
            continue


def _start_node(args: list[str], env: dict[str, str], log: Path, deadline: float) -> subprocess.Popen[bytes]:
    """``ray start --block`` until it says its node is up (it prints that once its raylet
    registered). Ray gives a raylet a fixed 30 s to register, which a loaded machine misses now
    and then although nothing is wrong: such a start is tried again, at most three times."""
    for attempt in range(1, 4):
        proc = _ray_start(args, env, log)
        while b"will now block forever" not in log.read_bytes():
            if proc.poll() is not None:
                _stop(proc)  # what it started before giving up
                if b"timed out during startup" in log.read_bytes() and attempt < 3:
                    break
                raise AssertionError(log.read_text())
            if time.monotonic() > deadline:
                _stop(proc)  # what it started so far
                raise AssertionError(f"the Ray node did not come up:\n{log.read_text()}")
            time.sleep(0.5)  # polling a log file: nothing else tells us
        else:
            return proc
    raise AssertionError("not reached")


def _set_uv_run_hook(on: bool) -> bool:
    """Set Ray's "replicate the `uv run` environment" switch in this process; the old value."""
    from ray._private import ray_constants

    old = ray_constants.RAY_ENABLE_UV_RUN_RUNTIME_ENV
    ray_constants.RAY_ENABLE_UV_RUN_RUNTIME_ENV = on
    return old


_NODE_ENV: dict[str, str] = {}  # the environment the cluster's nodes were started with


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A head and a worker node on 127.0.0.1, one CPU each: two one-CPU rollout workers must go
    one to each node. Yields the head's address."""
    flows_dir = Path(tempfile.mkdtemp(prefix="rllm-ray-flows-"))
    (flows_dir / "rllm_ray_flows.py").write_text(textwrap.dedent(FLOWS))
    sys.path.insert(0, str(flows_dir))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(flows_dir), os.environ.get("PYTHONPATH")])),
        # A raylet waits this long for its node's agent, which starts slowly on a loaded machine.
        "RAY_agent_register_timeout_ms": "180000",
        "RAY_raylet_start_wait_time_s": "120",
        # The GCS marks a node dead after a few missed health checks (5 × 3 s, 10 s each by
        # default); a raylet on a machine at load 10 missed them once in CI (stop 59's rerun) and
        # took the test's actor with it. A busy node is alive: give it minutes, not seconds.
        "RAY_health_check_failure_threshold": "40",
        "RAY_health_check_timeout_ms": "30000",
    }
    # A loopback cluster without token authentication (`ray start --head` turns it on, and this
    # process's Ray reads its token once, at import). Workers run this venv's Python: under
    # `uv run` Ray would otherwise rebuild the workspace into a fresh environment per worker.
    own = {"RAY_AUTH_MODE": "disabled", "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}
    saved = {k: os.environ.get(k) for k in own}
    os.environ.update(own)
    # This process's Ray read that variable when it was imported (at collection, before this
    # fixture): under `uv run … nox` its hook would start workers with nox's command line.
    uv_hook = _set_uv_run_hook(False)
    env.update(own)
    _NODE_ENV.clear()
    _NODE_ENV.update(env)
    # Short temp dirs: Ray's unix socket paths must stay under the 107-byte limit.
    temps = [tempfile.mkdtemp(prefix="rh", dir="/tmp"), tempfile.mkdtemp(prefix="rw", dir="/tmp")]
    address = f"127.0.0.1:{_free_port()}"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        deadline = time.monotonic() + RAY_START_WINDOW_S
        head = [
            "--head",
            f"--port={address.split(':')[1]}",
            f"--temp-dir={temps[0]}",
            "--include-dashboard=false",
        ]
        procs.append(_start_node(head, env, flows_dir / "head.log", deadline))
        node = [f"--address={address}", f"--temp-dir={temps[1]}"]
        procs.append(_start_node(node, env, flows_dir / "node.log", deadline))
        yield address
    finally:
        for proc in reversed(procs):
            _stop(proc)
        sys.path.remove(str(flows_dir))
        _set_uv_run_hook(uv_hook)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        for d in [*temps, str(flows_dir)]:
            shutil.rmtree(d, ignore_errors=True)


def _tasks(n: int) -> list[dict[str, str]]:
    return [{"id": f"t{i}", "instruction": "what is 2 + 2?"} for i in range(n)]


def _content(ep: Episode) -> tuple[object, ...]:
    """What a rollout produced, without ids, timings and where it ran."""
    steps = [
        (
            [m.content for m in s.input],
            s.output.content if s.output else None,
            list(s.prompt_ids or []),
            list(s.completion_ids or []),
            list(s.completion_logprobs or []),
            s.weight_version,
        )
        for t in ep.trajectories
        for s in t.steps
    ]
    return ep.task_id, ep.rollout_index, ep.termination_reason, ep.artifacts, steps


def _ray_config(address: str, **kw: object) -> RolloutConfig:
    return RolloutConfig(
        n=2,
        concurrency=8,
        progress=False,
        executor="ray",
        ray=RaySettings(address=address, num_workers=2, resources_per_worker={"CPU": 1.0}),
        **kw,  # type: ignore[arg-type]
    )


async def test_rollouts_spread_over_both_nodes_and_equal_the_local_executors(cluster, upstream):
    import rllm_ray_flows as flows  # type: ignore[import-not-found]

    local = RolloutConfig(n=2, concurrency=8, progress=False)
    async with RolloutEngine(flows.two_turns, None, local, upstreams=[upstream.url]) as engine:
        await engine.client.set_weight_version(3)
        expected = await engine.run(_tasks(12))

    async with RolloutEngine(flows.two_turns, None, _ray_config(cluster), upstreams=[upstream.url]) as engine:
        pool = engine._pool
        await engine.client.set_weight_version(3)  # the GatewayGroup reaches both nodes' gateways
        assert await engine.client.get_weight_version() == 3
        episodes = await engine.run(_tasks(12))
        by_node = dict(pool.completed_by_node)  # type: ignore[union-attr]
        nodes = {w.node_id for w in pool.workers}  # type: ignore[union-attr]
        submits = pool.submit_calls  # type: ignore[union-attr]
    assert len(nodes) == 2, "the two workers were not placed on two nodes"
    # Jobs travel in batches (one actor call per worker per loop pass), not one call per rollout:
    # the batch's first jobs (the pool's capacity) start together, in one call per worker.
    assert submits < 24, f"{submits} submit calls for 24 rollouts"
    assert set(by_node) == nodes and all(count > 0 for count in by_node.values()), by_node
    assert sum(by_node.values()) == 24
    assert all(ep.termination_reason == TerminationReason.DONE for ep in episodes), [
        ep.error for ep in episodes
    ]
    assert [_content(ep) for ep in episodes] == [_content(ep) for ep in expected]


async def test_a_dead_worker_is_retried_on_the_other_node_and_nothing_is_lost(cluster, upstream, tmp_path):
    import rllm_ray_flows as flows  # type: ignore[import-not-found]

    marker = tmp_path / "died"
    config = _ray_config(cluster, metadata={"die_once": str(marker)})
    async with RolloutEngine(flows.two_turns, None, config, upstreams=[upstream.url]) as engine:
        pool = engine._pool
        episodes = await engine.run(_tasks(10))
        alive = [w.node_id for w in pool.workers if w.alive]  # type: ignore[union-attr]
        lost = pool.workers_lost  # type: ignore[union-attr]
        by_node = dict(pool.completed_by_node)  # type: ignore[union-attr]
    assert marker.exists() and lost == 1 and len(alive) == 1
    assert [(ep.task_id, ep.rollout_index) for ep in episodes] == [
        (f"t{i}", r) for i in range(10) for r in range(2)
    ]
    assert all(ep.termination_reason == TerminationReason.DONE for ep in episodes), [
        ep.error for ep in episodes
    ]
    retried = [ep for ep in episodes if ep.metrics.get("worker_lost")]
    assert retried and all(ep.task_id == "t0" or ep.metrics["worker_lost"] == 1 for ep in retried)
    # Every rollout was answered once: the survivor's count is all rollouts but the dead one's.
    assert sum(by_node.values()) == 20 and by_node[alive[0]] >= len(retried)


async def _until(condition: Callable[[], bool], what: str, timeout_s: float = 120.0) -> None:
    """Wait for ``condition`` (a file another process writes: nothing else tells us)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


def _held(folder: Path) -> list[Path]:
    return [p for p in folder.iterdir() if not p.suffix]


def _cancelled(folder: Path) -> list[Path]:
    return list(folder.glob("*.cancelled"))


@pytest.fixture
def victim_node(cluster: str) -> Iterator[subprocess.Popen[bytes]]:
    """A third node (one CPU, custom resource ``victim``) whose workers see RLLM_TEST_NODE=victim;
    the test kills it, and teardown ends whatever it left (by process group)."""
    temp = tempfile.mkdtemp(prefix="rv", dir="/tmp")
    env = {**_NODE_ENV, "RLLM_TEST_NODE": "victim"}
    args = [f"--address={cluster}", f"--temp-dir={temp}", '--resources={"victim": 1}']
    proc = _start_node(args, env, Path(temp) / "node.log", time.monotonic() + RAY_START_WINDOW_S)
    try:
        yield proc
    finally:
        _stop(proc)
        shutil.rmtree(temp, ignore_errors=True)


def _raylet_pid(node: subprocess.Popen[bytes]) -> int:
    """The raylet that ``ray start`` (its own process group) started."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) != node.pid:
                continue
            with open(f"/proc/{entry.name}/comm") as f:
                if f.read().strip() == "raylet":
                    return int(entry.name)
        except (OSError, ProcessLookupError):
            continue
    raise AssertionError("the victim node has no raylet")


async def test_a_killed_node_s_rollouts_are_retried_on_the_others(cluster, victim_node, upstream, tmp_path):
    """SIGKILL of a whole non-head node's raylet mid-batch: its in-flight rollouts fail as a lost
    worker, run again on the other nodes, nothing is lost or answered twice, and the step's
    metrics count them in ``rollout/worker_lost``."""
    import rllm_ray_flows as flows  # type: ignore[import-not-found]

    config = RolloutConfig(
        n=2,
        concurrency=9,
        progress=False,
        executor="ray",
        # Three one-CPU workers on three one-CPU nodes: one on each, the victim's included.
        ray=RaySettings(address=cluster, num_workers=3, resources_per_worker={"CPU": 1.0}),
        metadata={"hold_dir": str(tmp_path), "hold_on": "victim"},
    )
    async with RolloutEngine(flows.held, None, config, upstreams=[upstream.url]) as engine:
        pool = engine._pool
        victim = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and "victim" in n["Resources"])
        assert victim in {w.node_id for w in pool.workers}  # type: ignore[union-attr]
        run = asyncio.create_task(engine.run(_tasks(6)))
        await _until(lambda: bool(_held(tmp_path)), "a rollout running on the victim node")
        os.kill(_raylet_pid(victim_node), signal.SIGKILL)
        killed = time.monotonic()
        episodes = await asyncio.wait_for(run, 300)
        print(f"batch complete {time.monotonic() - killed:.1f} s after the raylet's SIGKILL")
        lost = pool.workers_lost  # type: ignore[union-attr]
        by_node = dict(pool.completed_by_node)  # type: ignore[union-attr]
    assert lost == 1 and victim not in by_node and len(by_node) == 2, by_node
    assert [(ep.task_id, ep.rollout_index) for ep in episodes] == [
        (f"t{i}", r) for i in range(6) for r in range(2)
    ]
    assert all(ep.termination_reason == TerminationReason.DONE for ep in episodes), [
        ep.error for ep in episodes
    ]
    assert sum(by_node.values()) == 12  # each rollout answered exactly once
    retried = [ep for ep in episodes if ep.metrics.get("worker_lost")]
    assert all(ep.metrics["worker_lost"] == 1 for ep in retried)
    # Every rollout that had started on the victim (and any queued behind them there) ran again.
    assert len(retried) >= len(_held(tmp_path)) >= 1
    assert episode_metrics(episodes)["rollout/worker_lost"] == len(retried)


async def test_a_cancelled_rollout_is_cancelled_in_its_actor(cluster, upstream, tmp_path):
    """Cancelling the batch (a step cancelled, Ctrl-C) cancels each rollout in its Ray actor:
    the flow there gets CancelledError (before, only the driver's wait ended and the flow ran on)."""
    import rllm_ray_flows as flows  # type: ignore[import-not-found]

    config = _ray_config(cluster, metadata={"hold_dir": str(tmp_path)})
    async with RolloutEngine(flows.held, None, config, upstreams=[upstream.url]) as engine:
        run = asyncio.create_task(engine.run(_tasks(2)))
        await _until(lambda: len(_held(tmp_path)) == 4, "all four rollouts running in their actors")
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
        await _until(lambda: len(_cancelled(tmp_path)) == 4, "every remote flow cancelled")


async def test_cancels_of_rollouts_that_ended_leave_nothing_in_the_workers(cluster, upstream):
    """Many cancels that each reach its worker after the rollout ended there (its result already
    on the way back: a dropped group, a cancelled step): the worker keeps none of them. It used
    to keep each one in case its job was still to come, growing without bound over a long run."""
    import rllm_ray_flows as flows  # type: ignore[import-not-found]

    async with RolloutEngine(flows.two_turns, None, _ray_config(cluster), upstreams=[upstream.url]) as engine:
        episodes = await engine.run(_tasks(2))
        assert all(ep.termination_reason == TerminationReason.DONE for ep in episodes)
        pool: Any = engine._pool  # a RayFlowPool
        for w in pool.workers:
            # Every job this pool numbered has ended: sent through the worker's last batch.
            await w.actor.cancel.remote(list(range(1, 2001)), w.batches)
        held = [await w.actor.held.remote() for w in pool.workers]
    assert held == [{"running": 0, "cancels": 0}] * 2


async def test_a_rollout_past_its_deadline_is_cancelled_in_its_actor(cluster, upstream, tmp_path):
    import rllm_ray_flows as flows  # type: ignore[import-not-found]

    config = _ray_config(cluster, metadata={"hold_dir": str(tmp_path)}, deadline_s=2.0, max_retries=0)
    async with RolloutEngine(flows.held, None, config, upstreams=[upstream.url]) as engine:
        episodes = await engine.run(_tasks(1))
    assert [ep.termination_reason for ep in episodes] == [TerminationReason.TIMEOUT] * 2
    assert len(_cancelled(tmp_path)) == 2  # the flows were cancelled where they ran


async def test_a_ray_address_other_than_the_connected_one_is_refused(cluster, upstream):
    """Ray already initialised in this process (as the verl backend does) with one cluster and
    ``rollout.ray.address`` naming another: refused, naming both (it used to be ignored, the
    rollouts silently running on the connected cluster). The same cluster spelt another way is
    reused and left connected."""
    import rllm_ray_flows as flows  # type: ignore[import-not-found]

    from rllm.engine.rollout.ray_connect import current_ray_address

    ray.init(address=cluster, log_to_driver=False)
    try:
        other = f"127.0.0.1:{_free_port()}"
        engine = RolloutEngine(flows.two_turns, None, _ray_config(other), upstreams=[upstream.url])
        with pytest.raises(ConfigError, match=r"^config key `rollout\.ray\.address`: ") as err:
            await engine.start()
        await engine.close()
        # Both named: the one asked for and the one connected (as Ray reports it: the node's IP).
        message = str(err.value)
        assert f"'{other}'" in message and f"'{current_ray_address()}'" in message and "\n" not in message
        assert current_ray_address().endswith(f":{cluster.split(':')[1]}")
        same = f"localhost:{cluster.split(':')[1]}"
        async with RolloutEngine(
            flows.two_turns, None, _ray_config(same), upstreams=[upstream.url]
        ) as engine:
            episodes = await engine.run(_tasks(1))
        assert [ep.termination_reason for ep in episodes] == [TerminationReason.DONE] * 2
        assert ray.is_initialized()  # not shut down: the pool did not connect it
    finally:
        ray.shutdown()


async def test_a_worker_that_fails_to_start_fails_the_pool_at_once_with_its_own_line(cluster, upstream):
    """A worker whose flow module cannot be imported there (as when Ray's uv hook started the
    workers in an environment without the project) fails the pool at once, with that worker's
    error in one line: not Ray's page of traceback, not "did not all start" after
    ``start_timeout_s`` (an hour here)."""
    import rllm_ray_flows as flows  # type: ignore[import-not-found]

    from rllm.types.errors import StateError

    broken = RaySettings(
        address=cluster,
        num_workers=2,
        resources_per_worker={"CPU": 1.0},
        runtime_env={"env_vars": {"RLLM_TEST_BREAK_IMPORT": "1"}},
        start_timeout_s=3600,
    )
    config = RolloutConfig(n=1, concurrency=2, progress=False, executor="ray", ray=broken)
    engine = RolloutEngine(flows.two_turns, None, config, upstreams=[upstream.url])
    with pytest.raises(StateError) as err:
        await asyncio.wait_for(engine.start(), 600)
    await engine.close()
    message = str(err.value)
    assert message.startswith("a Ray rollout worker failed to start: "), message
    assert "ImportError: rllm_ray_flows cannot be imported on this worker" in message and "\n" not in message
    assert not ray.is_initialized()  # the Ray the pool connected is shut down with it


def _shell_call(name: str, **args: str) -> MockReply:
    call = {
        "id": f"call_{name}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)},
    }
    return MockReply(tool_calls=[call])


@needs_bwrap
async def test_the_terminal_cookbook_runs_on_ray_workers_with_warm_sandboxes(cluster):
    """The terminal cookbook (bubblewrap sandboxes) on both nodes' workers, a scripted model
    solving each task: every rollout is verified in its sandbox, each worker prepared sandboxes
    warm for the jobs it held, and each worker's acquire latency is recorded."""
    cookbook = load_cookbook("terminal")
    tasks = cookbook.load_tasks("train")[:5]
    solution = {t.instruction: t.metadata["solution"] for t in tasks}

    def respond(body: dict[str, object]) -> MockReply:
        messages = body["messages"]
        assert isinstance(messages, list)
        if any(m["role"] == "tool" for m in messages):
            return _shell_call("submit")
        return _shell_call("run_shell", command=solution[messages[1]["content"]])

    upstream = MockUpstream(responder=respond)
    await upstream.start()
    config = RolloutConfig(
        n=2,
        concurrency=4,
        worker_prefetch=3,
        sandbox_warm=3,
        max_retries=0,
        progress=False,
        executor="ray",
        ray=RaySettings(address=cluster, num_workers=2, resources_per_worker={"CPU": 1.0}),
    )
    try:
        async with RolloutEngine(
            cookbook.flow, cookbook.evaluator, config, upstreams=[upstream.url]
        ) as engine:
            pool = engine._pool
            episodes = await engine.run(tasks)
            by_node = dict(pool.completed_by_node)  # type: ignore[union-attr]
            per_worker = dict(pool.sandbox_acquire_s)  # type: ignore[union-attr]
    finally:
        await upstream.stop()
    assert all(ep.termination_reason == TerminationReason.DONE for ep in episodes), [
        ep.error for ep in episodes
    ]
    assert all(ep.is_correct and ep.trajectories[0].reward == 1.0 for ep in episodes)
    assert len(by_node) == 2 and sum(by_node.values()) == 10, by_node
    # Each worker's acquire latencies, in the pool and (by the episode's worker) in the step metrics.
    assert sorted(per_worker) == [0, 1] and sum(len(v) for v in per_worker.values()) == 10
    named = acquire_s_by_worker(episodes)
    assert len(named) == 2 and all(name.startswith("ray-") for name in named)
    assert sorted(sorted(v) for v in named.values()) == sorted(sorted(v) for v in per_worker.values())
    for worker, latencies in named.items():  # warm wherever the rollout ran
        warm = [
            ep
            for ep in episodes
            if ep.metadata["rollout_worker"] == worker and ep.metrics["sandbox_warm"] == 1.0
        ]
        assert warm, f"worker {worker} acquired every sandbox cold: {latencies}"
    metrics = episode_metrics(episodes)
    assert (
        metrics["sandbox/warm"] > 0
        and metrics["sandbox/acquire_s_slowest_worker"] >= metrics["sandbox/acquire_s"]
    )
    print("sandbox acquire s by worker:", {w: [round(x * 1000, 1) for x in v] for w, v in named.items()})
