"""Benchmark: sandbox desktops (``SandboxSpec.desktop``) against a plain Xvfb on the host, in
the same run: cold start, warm acquire, and the screenshot and action round trips.

- host (the peer): ``Xvfb`` + ``evilwm`` started directly on the host (no sandbox) on a free
  display; a screenshot is ``xwd | xwdtopnm`` + Pillow's PNG encode, an action one ``xdotool``
  click, each a plain subprocess;
- cold: ``backend.create(spec)`` of a desktop sandbox until its display accepts clients;
- warm: ``pool.acquire(spec)`` from a pool whose desktops were started ahead;
- screenshot / click / screenshot + click: ``rllm.sdk.desktop.Desktop`` on one sandbox, two
  ways alternating in the same loop: through the desktop helper (one long-lived process in the
  sandbox, a socket round trip per action) and ``helper=False`` (one ``exec`` of xdotool / xwd
  per action, what it replaced).

Targets: warm acquire <= 50 ms, screenshot + action <= 30 ms (medians). Run from the repository root:

    uv run python benchmarks/desktop_latency.py            # --n 20

Not a test: no timing is asserted anywhere.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import platform
import statistics
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable

from PIL import Image

from rllm.engine.sandbox import BubblewrapBackend, WarmPool
from rllm.sdk.desktop import Desktop
from rllm.sdk.sandbox import DesktopSpec, SandboxSpec

SPEC = SandboxSpec(desktop=DesktopSpec(width=1024, height=768))


def stats(values: list[float]) -> tuple[float, float]:
    values = sorted(values)
    return 1000 * statistics.median(values), 1000 * values[min(len(values) - 1, int(0.95 * len(values)))]


def show(name: str, values: list[float], peer: list[float] | None = None) -> None:
    median, p95 = stats(values)
    ratio = f"   x{median / stats(peer)[0]:.1f} the host's" if peer else ""
    print(f"{name:34s} median {median:8.2f} ms   p95 {p95:8.2f} ms{ratio}")


async def timed(n: int, fn: Callable[[], Awaitable[object]]) -> list[float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        await fn()
        times.append(time.perf_counter() - t0)
    return times


def host_peer(n: int) -> dict[str, list[float]]:
    """Xvfb + evilwm on the host: start, screenshot, click (plain subprocesses)."""
    starts: list[float] = []
    shots: list[float] = []
    clicks: list[float] = []
    for i in range(max(3, n // 4)):
        read_end, write_end = os.pipe()
        t0 = time.perf_counter()
        # No display number given: the server picks a free one and writes it once it accepts clients.
        server = subprocess.Popen(
            ["Xvfb", "-screen", "0", "1024x768x24", "-nolisten", "tcp", "-displayfd", str(write_end)],
            pass_fds=(write_end,),
            stderr=subprocess.DEVNULL,
        )
        os.close(write_end)
        with os.fdopen(read_end, "rb") as numbers:  # to the newline: closed early, the server fails
            display = ":" + numbers.readline().decode().strip()
        if display == ":":
            raise SystemExit("the host Xvfb did not start")
        env = {**os.environ, "DISPLAY": display}
        wm = subprocess.Popen(["evilwm", "-fn", "fixed"], env=env, stderr=subprocess.DEVNULL)
        starts.append(time.perf_counter() - t0)
        try:
            if i == 0:
                with tempfile.TemporaryDirectory() as tmp:
                    for _ in range(n):
                        t0 = time.perf_counter()
                        subprocess.run(
                            f"xwd -root -silent | xwdtopnm 2>/dev/null > {tmp}/s.ppm",
                            shell=True,
                            env=env,
                            check=True,
                        )
                        image = Image.open(f"{tmp}/s.ppm").convert("RGB")
                        image.save(io.BytesIO(), format="PNG", compress_level=1)
                        shots.append(time.perf_counter() - t0)
                        t0 = time.perf_counter()
                        subprocess.run(
                            ["xdotool", "mousemove", "10", "10", "click", "1"], env=env, check=True
                        )
                        clicks.append(time.perf_counter() - t0)
        finally:
            wm.kill()
            server.kill()
            wm.wait()
            server.wait()
    return {"start": starts, "shot": shots, "click": clicks}


async def sandboxed(n: int) -> dict[str, list[float]]:
    backend = BubblewrapBackend()
    await backend.check()
    cold: list[float] = []
    for _ in range(max(3, n // 4)):
        t0 = time.perf_counter()
        sandbox = await backend.create(SPEC)
        cold.append(time.perf_counter() - t0)
        await sandbox.close()
    warm: list[float] = []
    pool = WarmPool(backend, size=2)
    try:
        for _ in range(max(3, n // 4)):
            pool.schedule([SPEC])
            await pool.ready()  # the desktop is started ahead; only the hand-out is timed
            t0 = time.perf_counter()
            sandbox = await pool.acquire(SPEC)
            warm.append(time.perf_counter() - t0)
            await sandbox.close()
    finally:
        await pool.close()
    sandbox = await backend.create(SPEC)
    out: dict[str, list[float]] = {"cold": cold, "warm": warm}
    try:
        ways = {"helper": Desktop(sandbox), "exec": Desktop(sandbox, helper=False)}
        await ways["helper"].cursor()  # the helper's hello, once
        for _ in range(n):  # alternating, so load changes hit both alike
            for way, desktop in ways.items():
                for what, fn in (
                    ("shot", desktop.screenshot),
                    ("click", lambda d=desktop: d.click(10, 10)),
                    ("pair", lambda d=desktop: both(d)),
                ):
                    out.setdefault(f"{way} {what}", []).extend(await timed(1, fn))
        assert sandbox.desktop_helper is not None and sandbox.desktop_helper.state == "ready"
    finally:
        await sandbox.close()
    return out


async def both(desktop: Desktop) -> None:
    await desktop.screenshot()
    await desktop.click(12, 12)


def main() -> None:
    parser = argparse.ArgumentParser(description="sandbox desktop latency vs a host Xvfb")
    parser.add_argument("--n", type=int, default=20)
    args = parser.parse_args()
    print(f"{platform.node()}  {os.cpu_count()} CPUs  load {os.getloadavg()[0]:.1f}  1024x768x24")
    host = host_peer(args.n)
    ours = asyncio.run(sandboxed(args.n))
    show("host Xvfb start (peer)", host["start"])
    show("sandbox desktop cold create", ours["cold"], host["start"])
    show("sandbox desktop warm acquire", ours["warm"])
    host_pair = [a + b for a, b in zip(host["shot"], host["click"], strict=True)]
    show("host screenshot (peer)", host["shot"])
    show("host click (peer)", host["click"])
    show("host screenshot + click (peer)", host_pair)
    for way in ("exec", "helper"):
        show(f"sandbox screenshot, {way}", ours[f"{way} shot"], host["shot"])
        show(f"sandbox click, {way}", ours[f"{way} click"], host["click"])
        show(f"sandbox screenshot + click, {way}", ours[f"{way} pair"], host_pair)
    ratio = stats(ours["exec pair"])[0] / stats(ours["helper pair"])[0]
    print(f"screenshot + click: the helper is x{ratio:.1f} faster than an exec per action")


if __name__ == "__main__":
    main()
