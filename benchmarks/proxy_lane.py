"""Benchmark: the gateway's early proxy lane vs its task path (``proxy_lane=False``), same run.

Where it matters: an embedded gateway shares its event loop with the agents it serves (each
engine worker process runs both), so under load every extra pass through the loop's ready queue
waits behind everyone else's work. The lane answers a non-streaming call from I/O callbacks
(no task per call, two loop passes fewer per call than the task path).

One mock upstream in its own process; in this process a GatewayServer (memory store) and
``--concurrency`` agents calling it with aiohttp, in two settings: an idle loop, and a loop that
also runs ``--busy-ms`` of other CPU work per pass (standing in for the other rollouts of a
loaded worker). Each setting alternates lane / task path ``--rounds`` times and prints the
median latency per call (and, on the idle loop, this process's CPU per call) with the ratio
lane / task path (lower is better).

    uv run --no-sync python benchmarks/proxy_lane.py [--concurrency 4] [--calls 1000] [--rounds 6]
        [--busy-ms 1.0] [--latency 0.0]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import platform
import statistics
import time
from typing import Any

import msgspec


def _serve_upstream(latency: float, out: Any) -> None:
    import uvloop

    from rllm.testing import MockUpstream

    async def main() -> None:
        upstream = MockUpstream(latency=latency)
        await upstream.start()
        out.put(upstream.url)
        await asyncio.Event().wait()

    uvloop.run(main())


async def _busy(stop: asyncio.Event, busy_s: float) -> None:
    """Other work on the same loop: ``busy_s`` of CPU, then yield, every pass."""
    while not stop.is_set():
        t = time.perf_counter()
        while time.perf_counter() - t < busy_s:
            pass
        await asyncio.sleep(0)


async def _calls(http: Any, base: str, concurrency: int, calls: int, tag: str) -> tuple[float, float]:
    """Mean latency per call (ms) and this process's CPU per call (µs); agent ``k`` calls in
    session ``{tag}a{k}``."""
    latencies: list[float] = []

    async def agent(k: int) -> None:
        url = f"{base}/sessions/{tag}a{k}/v1/chat/completions"
        for i in range(calls // concurrency):
            body = msgspec.json.encode({"model": "m", "messages": [{"role": "user", "content": f"turn {i}"}]})
            t = time.perf_counter()
            async with http.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
                if r.status != 200:
                    raise RuntimeError(f"HTTP {r.status}: {await r.text()}")
                await r.read()
            latencies.append(time.perf_counter() - t)

    cpu = time.process_time()
    await asyncio.gather(*(agent(k) for k in range(concurrency)))
    return statistics.mean(latencies) * 1e3, (time.process_time() - cpu) / len(latencies) * 1e6


async def _compare(upstream: str, args: argparse.Namespace, busy_s: float) -> None:
    import aiohttp

    from rllm.gateway import GatewayConfig, GatewayServer

    servers = {}
    for lane in (True, False):
        servers[lane] = GatewayServer(
            GatewayConfig(upstreams=[upstream], health_interval_s=0, proxy_lane=lane)
        )
        await servers[lane].start()
    stop = asyncio.Event()
    busy = asyncio.create_task(_busy(stop, busy_s)) if busy_s > 0 else None
    results: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        for lane in (True, False):  # warm-up: connections, imports
            await _calls(http, servers[lane].url, args.concurrency, 4 * args.concurrency, "warm")
        for i in range(args.rounds):
            for lane in (False, True):
                # Fresh sessions each round: a finished session's id is refused (410) afterwards.
                tag = f"r{i}"
                results[lane].append(await _calls(http, servers[lane].url, args.concurrency, args.calls, tag))
                for k in range(args.concurrency):  # keep the stores from growing between rounds
                    await servers[lane].finish_session(f"{tag}a{k}")
    stop.set()
    if busy is not None:
        await busy
    for server in servers.values():
        await server.stop()
    lat = {k: statistics.median(r[0] for r in v) for k, v in results.items()}
    cpu = {k: statistics.median(r[1] for r in v) for k, v in results.items()}
    line = f"latency per call lane {lat[True]:.2f} ms vs task path {lat[False]:.2f} ms -> ratio {lat[True] / lat[False]:.3f}"
    if busy_s:
        setting = f"loop also busy {busy_s * 1e3:.1f} ms per pass"
    else:  # with the busy work on the loop, CPU per call would mostly be that work's
        setting = "idle loop"
        line += (
            f"; this process's CPU per call (gateway + agents) lane {cpu[True]:.0f} us vs "
            f"{cpu[False]:.0f} us -> ratio {cpu[True] / cpu[False]:.3f}"
        )
    print(f"{setting}, {args.concurrency} agents, upstream latency {args.latency * 1e3:.0f} ms: {line}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--calls", type=int, default=1000, help="calls per round and path")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--busy-ms", type=float, default=1.0)
    parser.add_argument("--latency", type=float, default=0.0, help="upstream latency, seconds")
    args = parser.parse_args()
    import uvloop

    print(f"# proxy_lane  {time.strftime('%Y-%m-%d %H:%M:%S')}  {platform.platform()}  cpus={os.cpu_count()}")
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_serve_upstream, args=(args.latency, out), daemon=True)
    proc.start()
    upstream = out.get(timeout=60)
    try:
        for busy_s in (0.0, args.busy_ms / 1e3):
            uvloop.run(_compare(upstream, args, busy_s))
    finally:
        proc.terminate()
        proc.join(timeout=5)


if __name__ == "__main__":
    main()
