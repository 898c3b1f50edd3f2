"""Benchmark: the rollout executors side by side: ``processes`` vs ``ray`` on one local node vs
``ray`` on two local nodes (``ray start --head`` + ``ray start --address``), same workers each.

C concurrent rollouts of a 5-turn agent against a mock LLM answering after 50 ms (its own
process). Little's law gives the ideal: C / (5 x 50 ms) rollouts per second. For each executor it
prints rollouts/s, the ratio to the ideal, and the CPU seconds per rollout of every process the
run started (engine, workers, gateways, Ray's daemons; the mock excluded) -- the difference to
``processes`` is what Ray adds -- three ways: the process tree's CPU during the run; the same net
of what the tree burns idle (measured for a few seconds before the run, scaled by the run's wall
time); and the whole machine's busy time less the mock's (honest only on an idle machine). On a machine with fewer cores than workers x nodes the 2-node
figure cannot show scaling; the script says so. Usage:

    uv run --no-sync python benchmarks/rollout_scaling.py [--rollouts 1000] [--concurrency 1000]
        [--workers 2] [--latency 0.05] [--skip-two-nodes]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing as mp
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rllm.sdk import rollout

TURNS = 5
IDLE_S = 3.0


@rollout
async def five_turns(task: Any, config: Any) -> dict[str, int]:
    """An agent loop: TURNS sequential chat calls through the worker's gateway (one aiohttp
    session per worker process, so the client library's cost does not hide the executor's)."""
    import aiohttp

    session = _SESSIONS.get(id(asyncio.get_running_loop()))
    if session is None or session.closed:
        session = _SESSIONS[id(asyncio.get_running_loop())] = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0)
        )
    messages = [{"role": "user", "content": task.instruction}]
    for _ in range(TURNS):
        async with session.post(
            f"{config.base_url}/chat/completions",
            json={"model": config.model, "messages": messages},
            headers={"Authorization": f"Bearer {config.api_key}"},
        ) as reply:
            body = await reply.json()
        messages += [body["choices"][0]["message"], {"role": "user", "content": "go on"}]
    return {"turns": TURNS}


_SESSIONS: dict[int, Any] = {}


def _serve_upstream(latency: float, out: Any) -> None:
    from rllm.testing import MockUpstream

    async def main() -> None:
        upstream = MockUpstream(latency=latency, responder=lambda body: "ok, next step.")
        await upstream.start()
        out.put(upstream.url)
        await asyncio.Event().wait()

    asyncio.run(main())


def _children(pid: int) -> list[int]:
    """Children started by ANY thread of ``pid``: a multi-threaded parent (Ray's raylet spawns
    its workers off the main thread) lists them under that thread's task only."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def _tree(roots: list[int]) -> list[int]:
    seen, todo = [], list(roots)
    while todo:
        pid = todo.pop()
        seen.append(pid)
        todo += _children(pid)
    return seen


def _cpu_s(pids: list[int]) -> dict[int, float]:
    out = {}
    for pid in pids:
        try:
            f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            out[pid] = (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            pass
    return out


def _machine_busy_s() -> float:
    """CPU seconds the whole machine spent busy (every core; /proc/stat's first line): counts what
    a process tree can miss (Ray daemons and workers re-parented away from this process)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


async def _run(
    executor: str,
    args: argparse.Namespace,
    upstream: str,
    roots: list[int],
    address: str | None,
    mock_pid: int,
) -> dict[str, float]:
    from rllm.engine.rollout.executors import RaySettings
    from rllm.engine.rollout.rollout_config import RolloutConfig
    from rllm.engine.rollout.rollout_engine import RolloutEngine

    config = RolloutConfig(
        concurrency=args.concurrency,
        progress=False,
        executor=executor,
        workers=args.workers,
        deadline_s=None,
        ray=RaySettings(
            address=address,
            num_workers=args.workers,
            resources_per_worker={"CPU": 0.0},
            # This file's folder first, then the caller's PYTHONPATH (an A/B run points it at
            # another checkout's engine: the workers must import the same one as the driver).
            runtime_env={
                "env_vars": {
                    "PYTHONPATH": os.pathsep.join(
                        filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")])
                    )
                }
            },
        ),
    )
    tasks = [{"id": f"t{i}", "instruction": "play"} for i in range(args.rollouts)]
    # Workers import the flow by name: from this file as a module, not from __main__.
    import rollout_scaling  # type: ignore[import-not-found]

    async with RolloutEngine(rollout_scaling.five_turns, None, config, upstreams=[upstream]) as engine:
        await engine.run(tasks[: min(50, len(tasks))])  # warm-up: connections, imports
        # What the executor burns while idle (Ray's daemons poll and heartbeat): its rate times
        # the run's wall time is background, not a per-rollout cost.
        idle0 = _cpu_s(_tree(roots))
        await asyncio.sleep(IDLE_S)
        idle1 = _cpu_s(_tree(roots))
        idle_rate = sum(idle1[p] - idle0.get(p, 0.0) for p in idle1) / IDLE_S
        before, machine0, mock0 = _cpu_s(_tree(roots)), _machine_busy_s(), _cpu_s([mock_pid])
        t0 = time.perf_counter()
        episodes = await engine.run(tasks)
        wall = time.perf_counter() - t0
        after, machine1, mock1 = _cpu_s(_tree(roots)), _machine_busy_s(), _cpu_s([mock_pid])
    ok = sum(ep.termination_reason == "done" for ep in episodes)
    cpu = sum(after[p] - before.get(p, 0.0) for p in after)
    # The whole machine's busy time less the mock's: honest only on an otherwise idle machine.
    machine = machine1 - machine0 - (mock1.get(mock_pid, 0.0) - mock0.get(mock_pid, 0.0))
    return {
        "wall_s": wall,
        "ok": ok,
        "rollouts_s": ok / wall,
        "cpu_ms_per_rollout": 1000 * cpu / max(ok, 1),
        "net_ms_per_rollout": 1000 * (cpu - idle_rate * wall) / max(ok, 1),
        "idle_cpu_per_s": idle_rate,
        "machine_ms_per_rollout": 1000 * machine / max(ok, 1),
    }


def _ray_node(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """``ray start --block`` until its node is up; a raylet that missed Ray's fixed 30 s
    registration window (a loaded machine) is started again, at most three times."""
    ray_cli = str(Path(sys.executable).with_name("ray"))
    common = ["--node-ip-address=127.0.0.1", "--disable-usage-stats", "--block"]
    for attempt in range(1, 4):
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [ray_cli, "start", *args, *common],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                # A process group, not a session: under the kernel's autogroup scheduling a new
                # session is one scheduling entity, so a Ray node would get a different CPU share
                # than the `processes` executor's workers (which stay in this session).
                process_group=0,
            )
        while b"will now block forever" not in log.read_bytes():
            if proc.poll() is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)  # what it started before giving up
                if b"timed out during startup" in log.read_bytes() and attempt < 3:
                    break
                raise SystemExit(f"ray start failed:\n{log.read_text()[-2000:]}")
            time.sleep(0.5)
        else:
            return proc
    raise SystemExit("ray start failed three times")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rollouts", type=int, default=1000)
    p.add_argument("--concurrency", type=int, default=1000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--latency", type=float, default=0.05)
    p.add_argument("--skip-two-nodes", action="store_true")
    args = p.parse_args()
    # Workers run this venv's Python (not a per-worker `uv run` environment); a loopback cluster.
    ray_env = {"RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0", "RAY_AUTH_MODE": "disabled"}
    ray_env["RAY_agent_register_timeout_ms"] = "180000"  # a raylet waits this long for its agent
    ray_env["RAY_raylet_start_wait_time_s"] = "120"
    os.environ.update(ray_env)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    mock = ctx.Process(target=_serve_upstream, args=(args.latency, queue), daemon=True)
    mock.start()
    upstream = queue.get(timeout=60)
    mock_pid = mock.pid
    assert mock_pid is not None  # started above
    ideal = args.concurrency / (TURNS * args.latency)
    results: dict[str, dict[str, float]] = {}

    def show(name: str) -> None:
        r, base = results[name], results["processes"]
        print(
            f"{name:14s} {r['rollouts_s']:8.1f} rollouts/s  {r['rollouts_s'] / ideal:5.2f} of ideal  "
            f"{r['cpu_ms_per_rollout']:6.1f} ms CPU/rollout ({r['cpu_ms_per_rollout'] - base['cpu_ms_per_rollout']:+.1f} "
            f"vs processes)  net of idle {r['net_ms_per_rollout']:6.1f} ms "
            f"({r['net_ms_per_rollout'] - base['net_ms_per_rollout']:+.1f}; idle {r['idle_cpu_per_s']:.2f} CPU)  "
            f"machine {r['machine_ms_per_rollout']:6.1f} ms CPU/rollout "
            f"({r['machine_ms_per_rollout'] - base['machine_ms_per_rollout']:+.1f})  ok {int(r['ok'])}",
            flush=True,
        )

    cores = os.cpu_count() or 1
    print(
        f"# {time.strftime('%Y-%m-%d')} {platform.machine()} {cores} cores, Python {platform.python_version()}"
    )
    print(
        f"{args.rollouts} rollouts of {TURNS} turns, concurrency {args.concurrency}, {args.workers} workers, "
        f"mock latency {args.latency * 1000:.0f} ms; ideal {ideal:.0f} rollouts/s",
        flush=True,
    )
    results["processes"] = asyncio.run(_run("processes", args, upstream, [os.getpid()], None, mock_pid))
    show("processes")
    # No address: the engine starts a local Ray (its daemons are this process's children) and
    # stops it at the end.
    results["ray, 1 node"] = asyncio.run(_run("ray", args, upstream, [os.getpid()], None, mock_pid))
    show("ray, 1 node")
    if not args.skip_two_nodes:
        temps = [tempfile.mkdtemp(prefix="rh", dir="/tmp"), tempfile.mkdtemp(prefix="rw", dir="/tmp")]
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]),
        }
        nodes = []
        try:
            nodes.append(
                _ray_node(
                    [
                        "--head",
                        f"--port={port}",
                        f"--temp-dir={temps[0]}",
                        "--include-dashboard=false",
                        f"--num-cpus={args.workers}",
                    ],
                    env,
                    Path(temps[0]) / "start.log",
                )
            )
            nodes.append(
                _ray_node(
                    [f"--address=127.0.0.1:{port}", f"--temp-dir={temps[1]}", f"--num-cpus={args.workers}"],
                    env,
                    Path(temps[1]) / "start.log",
                )
            )
            results["ray, 2 nodes"] = asyncio.run(
                _run(
                    "ray",
                    args,
                    upstream,
                    [os.getpid(), *(n.pid for n in nodes)],
                    f"127.0.0.1:{port}",
                    mock_pid,
                )
            )
            show("ray, 2 nodes")
        finally:
            for n in nodes:
                for sig in (signal.SIGTERM, signal.SIGKILL):
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(n.pid, sig)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        n.wait(timeout=30)
                        break
            for t in temps:
                shutil.rmtree(t, ignore_errors=True)
    mock.kill()
    if "ray, 2 nodes" in results:
        ratio = results["ray, 2 nodes"]["rollouts_s"] / results["ray, 1 node"]["rollouts_s"]
        note = (
            ""
            if cores >= 4 * args.workers
            else f" (only {cores} cores: both nodes share them, no scaling can show)"
        )
        print(f"2 nodes / 1 node: {ratio:.2f}x{note}")


if __name__ == "__main__":
    main()
