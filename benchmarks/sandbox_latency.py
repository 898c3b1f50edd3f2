"""Benchmark: acquire-to-first-exec latency of the bubblewrap sandbox, cold and from the warm
pool, next to a plain ``subprocess.run`` of the same command in the same run; then 64 sandboxes
at once next to 64 plain subprocesses at once.

- plain: ``subprocess.run(["/bin/sh", "-c", CMD])`` (no isolation at all): the peer;
- cold: ``backend.create(spec)`` then ``exec(CMD)`` (folders made, a bwrap started and woken);
- warm: ``pool.acquire(spec)`` from a pool whose sandboxes were prepared ahead, then ``exec(CMD)``;
- concurrent: 64 sandboxes created and each running CMD at once, vs 64 ``asyncio`` subprocesses;
- ``--close-files N``: ``close()`` of a sandbox holding N files, and the event loop's longest stall;
- ``--network``: the same with ``SandboxSpec(network=True)`` (each bwrap wired by slirp4netns);
- ``--parking N``: only cold starts, interleaved in one process, N each: without cgroups, with
  cgroups joined by the bwrap's own shell, and with shells parked ahead in fresh cgroups (the
  default; ``rllm.engine.sandbox.parked``).

Targets: warm <= 10 ms, cold <= 100 ms (medians). Run from the repository root:

    uv run python benchmarks/sandbox_latency.py            # --n 40 --concurrent 64

Not a test: no timing is asserted anywhere.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import subprocess
import time

from rllm.engine.sandbox import BubblewrapBackend, WarmPool
from rllm.engine.sandbox.cgroups import CgroupHost
from rllm.sdk.sandbox import SandboxSpec

CMD = "echo ready"


def ms(values: list[float]) -> str:
    values = sorted(values)
    p95 = values[min(len(values) - 1, int(0.95 * len(values)))]
    return f"median {1000 * statistics.median(values):7.2f} ms   p95 {1000 * p95:7.2f} ms"


def plain(n: int) -> list[float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(["/bin/sh", "-c", CMD], capture_output=True, check=True)
        times.append(time.perf_counter() - t0)
    return times


async def cold(backend: BubblewrapBackend, spec: SandboxSpec, n: int) -> list[float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        sandbox = await backend.create(spec)
        result = await sandbox.exec(CMD)
        times.append(time.perf_counter() - t0)
        assert result.stdout == "ready\n", result
        await sandbox.close()
    return times


async def warm(backend: BubblewrapBackend, spec: SandboxSpec, n: int, keep_open: bool) -> list[float]:
    """``keep_open=False``: each sandbox is closed (untimed) before the next acquire, as when a
    rollout ends; ``True``: all stay open, so each one's spare bwrap (started after its first
    exec, for its second) competes for the CPU with the next acquire."""
    pool = WarmPool(backend, size=n)
    pool.schedule([spec] * n)
    await pool.ready()  # prepared ahead, as while the previous batch's rollouts run
    times, used = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        sandbox = await pool.acquire(spec)
        result = await sandbox.exec(CMD)
        times.append(time.perf_counter() - t0)
        assert result.stdout == "ready\n", result
        if keep_open:
            used.append(sandbox)
        else:
            await sandbox.close()
    assert pool.stats["warm"] == n, pool.stats
    for sandbox in used:
        await sandbox.close()
    await pool.close()
    return times


async def concurrent_sandboxes(
    backend: BubblewrapBackend, spec: SandboxSpec, k: int
) -> tuple[float, list[float]]:
    async def one() -> float:
        t0 = time.perf_counter()
        sandbox = await backend.create(spec)
        try:
            result = await sandbox.exec(CMD)
            assert result.stdout == "ready\n", result
            return time.perf_counter() - t0
        finally:
            await sandbox.close()

    t0 = time.perf_counter()
    each = await asyncio.gather(*(one() for _ in range(k)))
    return time.perf_counter() - t0, list(each)


async def concurrent_plain(k: int) -> tuple[float, list[float]]:
    async def one() -> float:
        t0 = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(
            "/bin/sh", "-c", CMD, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        await proc.communicate()
        return time.perf_counter() - t0

    t0 = time.perf_counter()
    each = await asyncio.gather(*(one() for _ in range(k)))
    return time.perf_counter() - t0, list(each)


async def close_with_files(backend: BubblewrapBackend, files: int) -> tuple[float, float]:
    """``close()`` of a sandbox holding ``files`` files: its duration and the event loop's longest
    stall meanwhile (a ticker task yielding in a loop measures it)."""
    sandbox = await backend.create(SandboxSpec())
    folders = max(1, files // 100)
    make = f"import os\nfor i in range({folders}):\n os.mkdir(str(i))\n for j in range(100): open(f'{{i}}/{{j}}', 'w').close()"
    made = await sandbox.exec(["python3", "-c", make], timeout=600)
    assert made.ok, made
    stalls, stop = [0.0], False

    async def ticker() -> None:
        last = time.perf_counter()
        while not stop:
            await asyncio.sleep(0)
            now = time.perf_counter()
            stalls.append(now - last)
            last = now

    ticking = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    t0 = time.perf_counter()
    await sandbox.close()
    took = time.perf_counter() - t0
    stop = True
    await ticking
    return took, max(stalls)


async def parking(n: int) -> None:
    """Cold starts three ways, interleaved so that the machine's load falls on all alike."""
    backend = BubblewrapBackend()
    await backend.check()
    cgroups, lot = backend.cgroups, backend.lot
    if lot is None:
        print(f"no cgroups here, nothing to compare: {backend.mode()}")
        return
    spec = SandboxSpec()
    await cold(backend, spec, 3)
    ways = {
        "no cgroups": (CgroupHost("none"), None),
        "cgroups, joined": (cgroups, None),
        "cgroups, parked": (cgroups, lot),
    }
    times: dict[str, list[float]] = {way: [] for way in ways}
    for _ in range(n):
        for way, (host, parked) in ways.items():
            backend.cgroups, backend.lot = host, parked
            times[way] += await cold(backend, spec, 1)
        await asyncio.sleep(0.05)  # between rollouts: the lot refills in its thread
    print(f"cold create + first exec, interleaved, n={n}, cgroup {cgroups.version}")
    for way, values in times.items():
        print(f"{way:18s} {ms(values)}")


async def main(n: int, k: int, close_files: int = 0, network: bool = False) -> None:
    backend = BubblewrapBackend()
    spec = SandboxSpec(network=network)
    await backend.check()
    await cold(backend, spec, 3)  # warm the page cache and the interpreter's code paths
    print(
        f"sandbox latency, {platform.machine()} {os.cpu_count()} cpus, n={n}, command {CMD!r}, network={network}"
    )
    base = plain(n)
    cold_t = await cold(backend, spec, n)
    warm_t = await warm(backend, spec, n, keep_open=False)
    warm_open = await warm(backend, spec, n, keep_open=True)
    print(f"plain subprocess.run        {ms(base)}")
    print(
        f"cold  create + first exec   {ms(cold_t)}   ({statistics.median(cold_t) / statistics.median(base):.1f}x plain)"
    )
    print(
        f"warm  acquire + first exec  {ms(warm_t)}   ({statistics.median(warm_t) / statistics.median(base):.1f}x plain)"
    )
    print(
        f"warm, earlier ones kept open {ms(warm_open)}   ({statistics.median(warm_open) / statistics.median(base):.1f}x plain)"
    )
    print("targets: warm <= 10 ms, cold <= 100 ms (medians)")
    wall_s, each_s = await concurrent_sandboxes(backend, spec, k)
    wall_p, each_p = await concurrent_plain(k)
    print(f"{k} sandboxes at once        wall {1000 * wall_s:7.1f} ms   per sandbox {ms(each_s)}")
    print(f"{k} plain subprocesses      wall {1000 * wall_p:7.1f} ms   per process {ms(each_p)}")
    print(f"concurrent wall ratio (sandboxes / plain): {wall_s / wall_p:.1f}x")
    if close_files:
        took, stall = await close_with_files(backend, close_files)
        print(
            f"close with {close_files} files       {1000 * took:7.0f} ms   longest event-loop stall {1000 * stall:.0f} ms"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "sandbox latency").splitlines()[0])
    parser.add_argument("--n", type=int, default=40, help="sequential samples per variant")
    parser.add_argument("--concurrent", type=int, default=64, help="sandboxes started at once")
    parser.add_argument(
        "--close-files", type=int, default=0, help="also time close() of a sandbox with this many files"
    )
    parser.add_argument(
        "--network", action="store_true", help="networked sandboxes (own namespace + slirp4netns, as root)"
    )
    parser.add_argument(
        "--parking", type=int, default=0, help="only compare cold starts with/without parked cgroup shells"
    )
    args = parser.parse_args()
    if args.parking:
        asyncio.run(parking(args.parking))
    else:
        asyncio.run(main(args.n, args.concurrent, args.close_files, args.network))
