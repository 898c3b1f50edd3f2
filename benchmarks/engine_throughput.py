"""Benchmark: RolloutEngine throughput on 5-turn agent flows against a mock upstream.

(a) Latency-bound: the upstream answers after 50 ms; C concurrent rollouts of 5 sequential calls
    can at best finish C / (5 x 50 ms) rollouts per second. Prints achieved / ideal (target >= 0.9),
    and the same agent loop calling the upstream directly from one process (no rLLM). 1,000
    concurrent rollouts are 20,000 LLM calls/s: more than one core of agent code and HTTP, so
    reaching the target needs ``--workers`` (engine worker processes, each with its own embedded
    gateway) and ``--upstreams`` (mock processes) on a machine with the cores for them.
(b) Overhead: a zero-latency upstream; the same agent loop run (1) through the rLLM engine and
    gateway and (2) calling the upstream directly with no rLLM in the path, in the same run.
    Prints engine / direct throughput (target >= 0.5).

Layout (like a deployment): the mock upstream and the gateway each run in their own process;
the engine and the agent flows run in this one. The agent loop uses one shared aiohttp session,
so the client library's own cost does not hide the engine's. Usage:

    uv run --no-sync python benchmarks/engine_throughput.py [--concurrency 1000] [--rollouts N]
        [--overhead-concurrency 64] [--overhead-rollouts 2000] [--in-process]
        [--workers N --upstreams K]   # (a) on a many-core machine, e.g. --workers 12 --upstreams 4
        [--overhead-workers 2]        # (b) with two engine worker processes
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import multiprocessing as mp
import os
import platform
import resource
import time
from pathlib import Path
from typing import Any

import msgspec

from rllm.sdk import rollout

TURNS = 5


def _install_uvloop() -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass


def _serve_upstream(latency: float, out: Any) -> None:
    """Child process: a MockUpstream answering every chat call with a short fixed reply."""
    _install_uvloop()
    from rllm.engine.rollout.rollout_config import RolloutConfig
    from rllm.runtime.gc_threshold import raise_gc_threshold

    # Like the engine's own processes: with hundreds of answers pending (each a task, a timer and
    # a request) the default threshold spent about a tenth of this stand-in's CPU collecting.
    raise_gc_threshold(RolloutConfig().gc_gen0_threshold)
    from rllm.testing import MockUpstream

    async def main() -> None:
        upstream = MockUpstream(latency=latency, responder=lambda body: "ok, next step.")
        await upstream.start()
        out.put(upstream.url)
        await asyncio.Event().wait()

    asyncio.run(main())


def _serve_gateway(upstream_url: str, out: Any) -> None:
    """Child process: a GatewayServer in front of the upstream (memory store, no auth), set up
    as `rllm-gateway serve` sets up its process."""
    from rllm.gateway import GatewayConfig, GatewayServer
    from rllm.gateway.command import prepare_process

    config = GatewayConfig(upstreams=[upstream_url], auto_create_sessions=False, health_interval_s=5.0)
    prepare_process(config)

    async def main() -> None:
        server = GatewayServer(config)
        await server.start()
        out.put(server.url)
        await asyncio.Event().wait()

    asyncio.run(main())


def _cpu(pids: dict[str, int]) -> dict[str, float]:
    """utime + stime (seconds) of each process, from /proc (Linux)."""
    out = {}
    for name, pid in pids.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            out[name] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            out[name] = float("nan")
    return out


def _spawn(target: Any, *args: Any) -> tuple[mp.Process, str]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=target, args=(*args, queue), daemon=True)
    proc.start()
    return proc, queue.get(timeout=60)


_HTTP: dict[int, Any] = {}  # one aiohttp session per event loop (and so per process)


def _http() -> Any:
    import aiohttp

    loop = asyncio.get_running_loop()
    session = _HTTP.get(id(loop))
    if session is None or session.closed:
        session = _HTTP[id(loop)] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        if mp.parent_process() is not None:
            # An engine worker process keeps this session until it exits; asyncio would report
            # it as unclosed then, once per worker.
            logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    return session


async def _close_http() -> None:
    session = _HTTP.pop(id(asyncio.get_running_loop()), None)
    if session is not None:
        await session.close()


@rollout
async def five_turns(task: Any, config: Any) -> None:
    """The agent loop every path runs: 5 chat turns, each appending the reply and a new user turn.
    Module-level, so worker processes can import it; one shared aiohttp session per process and
    msgspec JSON, so the agent's own cost does not hide the engine's."""
    http = _http()
    messages = [{"role": "user", "content": task.instruction}]
    url = config.base_url + "/chat/completions"
    headers = {"Authorization": f"Bearer {config.api_key}", "Content-Type": "application/json"}
    for turn in range(TURNS):
        body = {"model": config.model, "messages": messages, "max_tokens": 32}
        async with http.post(url, data=msgspec.json.encode(body), headers=headers) as resp:
            if resp.status != 200:
                raise RuntimeError(f"turn {turn}: HTTP {resp.status}: {await resp.text()}")
            data = msgspec.json.decode(await resp.read())
        messages.append({"role": "assistant", "content": data["choices"][0]["message"]["content"]})
        messages.append({"role": "user", "content": f"continue ({turn + 1})"})


async def run_engine(
    gateway_url: str | None,
    upstream_urls: list[str],
    concurrency: int,
    rollouts: int,
    workers: int = 1,
    watch: dict[str, int] | None = None,
    prefetch: int | None = None,
) -> dict[str, Any]:
    from rllm.engine.rollout.rollout_config import RolloutConfig
    from rllm.engine.rollout.rollout_engine import RolloutEngine
    from rllm.types import Task

    tasks = [Task(id=f"t{i}", instruction=f"task {i}: solve it") for i in range(rollouts)]
    config = RolloutConfig(
        n=1,
        concurrency=concurrency,
        progress=False,
        max_retries=0,
        deadline_s=300,
        workers=workers,
        worker_prefetch=prefetch,
    )
    if gateway_url is not None:
        engine = RolloutEngine(five_turns, None, config, gateway_url=gateway_url)
    else:
        engine = RolloutEngine(five_turns, None, config, upstreams=upstream_urls)
    try:
        async with engine:
            await engine.run(tasks[: min(50 * workers, rollouts)])  # warm-up: connections, imports
            # CPU of every process in the timed window: which one saturates first.
            pids = {"engine (parent)": os.getpid(), **(watch or {})}
            for i, child in enumerate(mp.active_children()):
                if child.name.startswith("rllm-rollout-"):
                    pids[f"worker {i}"] = child.pid
            episodes, done_at = [], []
            cpu0 = _cpu(pids)
            t0 = time.perf_counter()
            async for group in engine.stream(tasks):
                episodes.extend(group)
                done_at.append(time.perf_counter())
            elapsed = time.perf_counter() - t0
            cpu1 = _cpu(pids)
    finally:
        await _close_http()
    ok = [ep for ep in episodes if str(ep.termination_reason) == "done"]
    steps = sum(len(t.steps) for ep in ok for t in ep.trajectories)
    if len(ok) != rollouts or steps != rollouts * TURNS:
        failed = next((ep for ep in episodes if ep.error is not None), None)
        raise SystemExit(
            f"engine run lost work: {len(ok)}/{rollouts} ok, {steps} steps; e.g. {failed and failed.error}"
        )
    # Steady state of the closed loop: from the end of the first wave (``concurrency`` rollouts
    # done) to the moment the last rollout starts (``rollouts - concurrency`` done); the ramp-up
    # and the drain, when fewer than ``concurrency`` rollouts are in flight, fall outside.
    steady = float("nan")
    if rollouts >= 3 * concurrency:
        first, last = done_at[concurrency - 1], done_at[rollouts - concurrency - 1]
        steady = (rollouts - 2 * concurrency) / (last - first)
    busy = {k: (cpu1[k] - cpu0[k]) / elapsed for k in pids}
    # Where a rollout's time goes: the upstream calls as the gateway timed them, the rest of the
    # rollout as the engine (or its worker) timed it, and the remainder of the time in flight.
    calls_s = sum(s.timing.get("latency_s", 0.0) for ep in ok for t in ep.trajectories for s in t.steps)
    rollout_s = sum(ep.metrics.get("rollout_s", 0.0) for ep in ok)
    lags = [ep.metrics.get("loop_lag_s", 0.0) for ep in ok]
    # Slots' waits for a job in the steady state (the first wave waited for the batch to start).
    middle = episodes[concurrency:-concurrency] if rollouts >= 3 * concurrency else episodes
    slot_wait = sum(ep.metrics.get("slot_wait_s", 0.0) for ep in middle) / len(middle)
    return {
        "rollouts_per_s": rollouts / elapsed,
        "elapsed_s": elapsed,
        "steady_per_s": steady,
        "busy": busy,
        "calls_s": calls_s / len(ok),
        "rollout_s": rollout_s / len(ok),
        "loop_lag_s": (sum(lags) / len(lags), max(lags)),
        "slot_wait_s": slot_wait,
    }


def _print_latency(result: dict[str, Any], concurrency: int, ideal_s: float) -> None:
    """Little's law: with ``concurrency`` rollouts always in flight, each spends concurrency / rate
    seconds in flight; split that into the upstream calls, the rest of the rollout and dispatch."""
    rate = (
        result["steady_per_s"]
        if result["steady_per_s"] == result["steady_per_s"]
        else result["rollouts_per_s"]
    )
    in_flight, rollout, calls = concurrency / rate, result["rollout_s"], result["calls_s"]
    print(
        f"    per rollout: {in_flight * 1e3:.1f} ms in flight (ideal {ideal_s * 1e3:.0f}) = upstream calls "
        f"{calls * 1e3:.1f} ms (as the gateway timed them) + rest of the rollout {(rollout - calls) * 1e3:.1f} ms "
        f"(agent, sessions, episode) + {(in_flight - rollout) * 1e3:.1f} ms dispatch and queueing "
        f"(steady state: worker slots idle, waiting for a job, {result['slot_wait_s'] * 1e3:.1f} ms); "
        f"event-loop lag where the flows ran: mean {result['loop_lag_s'][0] * 1e3:.1f} ms, "
        f"max {result['loop_lag_s'][1] * 1e3:.1f} ms"
    )


def _print_busy(busy: dict[str, float], rollouts_per_s: float) -> None:
    """Cores each process kept busy, and its CPU per rollout (workers and upstreams summed)."""
    groups: dict[str, list[float]] = {}
    for name, cores in busy.items():
        groups.setdefault(name.split(" ")[0], []).append(cores)
    parts = []
    for name, values in groups.items():
        total = sum(values)
        spread = f" ({len(values)} procs, max {max(values):.2f})" if len(values) > 1 else ""
        parts.append(f"{name} {total:.2f} cores{spread} = {total / rollouts_per_s * 1e6:.0f} us/rollout")
    print("    cpu: " + "; ".join(parts))


async def run_direct(upstream_url: str, concurrency: int, rollouts: int) -> dict[str, float]:
    from rllm.types import AgentConfig, Task

    config = AgentConfig(base_url=upstream_url)
    queue: asyncio.Queue[int] = asyncio.Queue()

    async def worker() -> None:
        while not queue.empty():
            i = queue.get_nowait()
            await five_turns.run(Task(id=f"t{i}", instruction=f"task {i}: solve it"), config)

    try:
        for i in range(min(50, rollouts)):  # warm-up
            queue.put_nowait(i)
        await asyncio.gather(*(worker() for _ in range(min(concurrency, 50))))
        for i in range(rollouts):
            queue.put_nowait(i)
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(min(concurrency, rollouts))))
        elapsed = time.perf_counter() - t0
    finally:
        await _close_http()
    return {"rollouts_per_s": rollouts / elapsed, "elapsed_s": elapsed}


def _direct_process(upstream_url: str, concurrency: int, rollouts: int, barrier: Any, out: Any) -> None:
    """Child process: warm up, wait for the others, then time the direct agent loop."""
    _install_uvloop()

    async def timed() -> tuple[float, float]:
        await run_direct(upstream_url, concurrency, min(50, rollouts))  # warm-up: connections, imports
        await asyncio.to_thread(barrier.wait)
        t0 = time.time()
        await run_direct(upstream_url, concurrency, rollouts)
        return t0, time.time()

    out.put(asyncio.run(timed()))


def run_direct_processes(
    upstreams: list[str], concurrency: int, rollouts: int, processes: int
) -> dict[str, float]:
    """The direct agent loop in ``processes`` processes at once; with 1, in this process."""
    if processes == 1:
        return asyncio.run(run_direct(upstreams[0], concurrency, rollouts))
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(processes), ctx.Queue()
    shares = [concurrency // processes + (i < concurrency % processes) for i in range(processes)]
    counts = [rollouts // processes + (i < rollouts % processes) for i in range(processes)]
    procs = [
        ctx.Process(
            target=_direct_process,
            args=(upstreams[i % len(upstreams)], shares[i], counts[i], barrier, out),
            daemon=True,
        )
        for i in range(processes)
    ]
    for proc in procs:
        proc.start()
    spans = [out.get(timeout=600) for _ in procs]
    for proc in procs:
        proc.join(timeout=10)
    elapsed = max(end for _, end in spans) - min(start for start, _ in spans)
    return {"rollouts_per_s": rollouts / elapsed, "elapsed_s": elapsed}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", type=int, default=1000, help="(a) concurrent rollouts")
    parser.add_argument("--latency", type=float, default=0.05, help="(a) upstream latency, seconds")
    parser.add_argument(
        "--rollouts", type=int, default=None, help="(a) rollouts to time (default 2 x concurrency)"
    )
    parser.add_argument("--overhead-concurrency", type=int, default=64, help="(b) concurrent rollouts")
    parser.add_argument("--overhead-rollouts", type=int, default=2000, help="(b) rollouts per path")
    parser.add_argument(
        "--overhead-workers",
        type=int,
        default=1,
        help="(b) engine worker processes (>1: each embeds its gateway; the direct loop stays one process)",
    )
    parser.add_argument(
        "--in-process", action="store_true", help="start the gateway inside the engine's process"
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="(a) engine worker processes, each with its own embedded gateway (RolloutConfig.workers)",
    )
    parser.add_argument("--upstreams", type=int, default=1, help="(a) mock upstream processes")
    parser.add_argument(
        "--prefetch", type=int, default=None, help="(a) RolloutConfig.worker_prefetch (default: half a share)"
    )
    parser.add_argument("--skip-a", action="store_true")
    parser.add_argument("--skip-b", action="store_true")
    args = parser.parse_args()
    _install_uvloop()
    print(
        f"# engine_throughput  {time.strftime('%Y-%m-%d %H:%M:%S')}  {platform.platform()}  cpus={os.cpu_count()}"
    )
    layout = "in the engine process" if args.in_process else "own process"
    if args.workers > 1:
        layout = f"one embedded in each of {args.workers} engine worker processes (a)"
    print(f"# gateway: {layout}; upstream: own process ({args.upstreams} for (a))")
    procs: list[mp.Process] = []
    try:
        if not args.skip_a:
            upstreams = []
            for _ in range(args.upstreams):
                proc, url = _spawn(_serve_upstream, args.latency)
                procs.append(proc)
                upstreams.append(url)
            upstream = upstreams[0]
            gateway = None
            if not args.in_process and args.workers == 1:
                proc, gateway = _spawn(_serve_gateway, upstream)
                procs.append(proc)
            n = args.rollouts or 2 * args.concurrency
            watch = {f"upstream {i}": p.pid for i, p in enumerate(procs[: args.upstreams])}
            if gateway is not None:
                watch["gateway"] = procs[-1].pid
            result = asyncio.run(
                run_engine(gateway, upstreams, args.concurrency, n, args.workers, watch, args.prefetch)
            )
            ideal = args.concurrency / (TURNS * args.latency)
            print(
                f"(a) latency {args.latency * 1000:.0f} ms, concurrency {args.concurrency}, {n} rollouts: "
                f"{result['rollouts_per_s']:.1f} rollouts/s vs ideal {ideal:.1f} -> ratio "
                f"{result['rollouts_per_s'] / ideal:.3f} (target >= 0.9); steady state "
                f"{result['steady_per_s']:.1f} rollouts/s -> ratio {result['steady_per_s'] / ideal:.3f}"
            )
            _print_busy(result["busy"], result["rollouts_per_s"])
            _print_latency(result, args.concurrency, TURNS * args.latency)
            # The machine's own ceiling: the same agent loop with no rLLM in the path, in as many
            # processes as the engine had (each with its share of the concurrency, the upstreams
            # dealt round robin). Where it is below the ideal, the CPU (not rLLM) bounds the run.
            direct = run_direct_processes(upstreams, args.concurrency, n, args.workers)
            print(
                f"    direct (no rLLM, {args.workers} process(es), same concurrency): "
                f"{direct['rollouts_per_s']:.1f} rollouts/s = {direct['rollouts_per_s'] / ideal:.3f} of ideal; "
                f"engine / direct = {result['rollouts_per_s'] / direct['rollouts_per_s']:.3f}"
            )
        if not args.skip_b:
            proc, upstream0 = _spawn(_serve_upstream, 0.0)
            procs.append(proc)
            gateway0 = None
            if not args.in_process and args.overhead_workers == 1:
                proc, gateway0 = _spawn(_serve_gateway, upstream0)
                procs.append(proc)
            c, n, workers = args.overhead_concurrency, args.overhead_rollouts, args.overhead_workers
            # "this process" runs the direct agent loop, then the engine (and its agents when
            # workers == 1); worker processes are counted once they have exited (RUSAGE_CHILDREN).
            pids = {"this process": os.getpid(), "upstream": procs[-2 if gateway0 else -1].pid}
            if gateway0:
                pids["gateway"] = procs[-1].pid
            before = _cpu(pids)
            direct = asyncio.run(run_direct(upstream0, c, n))
            middle = _cpu(pids)
            children = resource.getrusage(resource.RUSAGE_CHILDREN)
            engine = asyncio.run(run_engine(gateway0, [upstream0], c, n, workers))
            after = _cpu(pids)
            ended = resource.getrusage(resource.RUSAGE_CHILDREN)
            print(
                f"(b) zero latency, concurrency {c}, {n} rollouts, {workers} engine process(es): direct "
                f"{direct['rollouts_per_s']:.1f} rollouts/s, engine+gateway {engine['rollouts_per_s']:.1f} "
                f"rollouts/s -> ratio {engine['rollouts_per_s'] / direct['rollouts_per_s']:.3f} (target >= 0.5)"
            )
            # CPU per rollout by process (warm-up included): where the proxied layout's time goes.
            for label, t0, t1 in (("direct", before, middle), ("engine", middle, after)):
                per = {k: (t1[k] - t0[k]) / (n + 50) * 1e6 for k in pids}
                print(f"    cpu/rollout {label}: " + ", ".join(f"{k} {v:.0f} us" for k, v in per.items()))
            if workers > 1:
                spent = ended.ru_utime + ended.ru_stime - children.ru_utime - children.ru_stime
                print(f"      + engine worker processes {spent / (n + 50) * 1e6:.0f} us (startup included)")
    finally:
        for proc in procs:
            proc.terminate()
            proc.join(timeout=5)


if __name__ == "__main__":
    main()
