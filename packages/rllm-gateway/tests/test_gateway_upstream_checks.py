"""What `rllm-gateway serve` says about its upstreams (issue #49): an upstream URL without /v1
is warned about at start, in one line naming it, and ``GET /health`` is not "ok" while no
upstream is healthy (503, with the reason in the body). Real gateway processes; each is read
once it prints the line saying where it listens."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from rllm.testing import MockUpstream

SERVE = ["serve", "--port", "0", "--health-interval-s", "0", "--admin-key", "k"]


class Served:
    def __init__(self, proc: subprocess.Popen[str], url: str) -> None:
        self.proc = proc
        self.url = url

    def health(self) -> tuple[int, dict[str, object]]:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=60) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def stop(self) -> list[str]:
        """Stop it (SIGINT); its stderr lines."""
        self.proc.send_signal(signal.SIGINT)
        _, err = self.proc.communicate(timeout=60)
        return err.splitlines()


@pytest.fixture
def serve() -> Iterator[object]:
    started: list[Served] = []

    def start(*upstreams: str) -> Served:
        args = [a for url in upstreams for a in ("--upstream", url)]
        env = {k: v for k, v in os.environ.items() if k != "RLLM_GATEWAY_ADMIN_KEY"}
        proc = subprocess.Popen(
            [sys.executable, "-m", "rllm.gateway.command", *SERVE, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert proc.stdout is not None
        line = proc.stdout.readline()  # printed once it listens, after its start-up checks
        served = Served(proc, line.strip().rsplit(" ", 1)[-1])
        started.append(served)
        assert line.startswith("rllm-gateway listening on"), (line, served.stop())
        return served

    yield start
    for served in started:
        if served.proc.poll() is None:
            served.stop()


def _nobody_listens() -> str:
    import socket

    with socket.socket() as probe:  # a port that was free a moment ago: nobody listens there now
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


def test_an_upstream_without_v1_is_warned_about_and_health_says_none_is_healthy(serve) -> None:
    base = _nobody_listens()
    gateway = serve(base)
    status, body = gateway.health()
    assert status == 503 and body["status"] == "unavailable", body
    assert body["reason"].startswith("0 of 1 upstreams healthy") and body["healthy_upstreams"] == 0
    warnings = [line for line in gateway.stop() if "/v1" in line]
    assert warnings == [
        f"rllm-gateway: warning: upstream {base} does not end in /v1: model calls go to "
        f"{base}/chat/completions (did you mean {base}/v1?)"
    ]


async def test_a_healthy_upstream_with_v1_is_ok_and_not_warned_about(serve) -> None:
    async with MockUpstream() as upstream:
        # In threads: the upstream answers the gateway's checks on this test's event loop.
        gateway = await asyncio.to_thread(serve, upstream.url)
        status, body = await asyncio.to_thread(gateway.health)
        err = await asyncio.to_thread(gateway.stop)
    assert upstream.url.endswith("/v1")
    assert status == 200 and body["status"] == "ok" and "reason" not in body, body
    assert not [line for line in err if "/v1" in line], err
