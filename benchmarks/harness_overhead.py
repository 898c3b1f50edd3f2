"""Benchmark: per-rollout overhead of a command harness and of the remote agent protocol, each
against an in-process ``@rollout`` flow doing the same model calls, in one run.

- command harness (``rllm.sdk.command_flow``): a Python script with the openai client and a bash
  script with curl, one model call each, against an in-process flow making that one call; also
  the time from the rollout's start to the model call arriving (process start to first call);
- remote protocol (``rollout.executor = "remote"``): a 5-turn episode run by an agent service
  (``rllm agent serve`` in its own process) against the same 5-turn flow in process;
- the bash harness again inside a bwrap sandbox (``command_flow(..., sandbox=SandboxSpec())``,
  one sandbox prepared ahead), through the gateway bridge, against the same harness unsandboxed.

Everything runs on loopback against the zero-latency MockUpstream through the engine's own
gateway, one rollout at a time, so the difference is the harness's own cost. Prints mean and
median per rollout and the ratio to the in-process peer. Not a test: nothing is asserted.

    uv run python benchmarks/harness_overhead.py            # --rollouts 20
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rllm.engine.rollout.remote_executor import RemoteSettings
from rllm.engine.rollout.rollout_config import RolloutConfig
from rllm.engine.rollout.rollout_engine import RolloutEngine
from rllm.sdk import AgentConfig, Task, command_flow, rollout
from rllm.sdk.clients import async_openai
from rllm.sdk.sandbox import SandboxSpec
from rllm.testing import MockUpstream

ARRIVALS: list[float] = []  # when each model call reached the upstream (one rollout at a time)

PY_HARNESS = """
import os, sys
from openai import OpenAI
reply = OpenAI(max_retries=0).chat.completions.create(
    model=os.environ["OPENAI_MODEL"], messages=[{"role": "user", "content": sys.argv[1]}])
print(reply.choices[0].message.content)
"""
CURL_HARNESS = r"""
body=$(printf '{"model": "%s", "messages": [{"role": "user", "content": "%s"}]}' "$OPENAI_MODEL" "$1")
curl -sSf "$OPENAI_BASE_URL/chat/completions" -H "Authorization: Bearer $OPENAI_API_KEY" \
  -H 'Content-Type: application/json' -d "$body"
"""
AGENT_MODULE = """
from rllm.sdk import rollout
from rllm.sdk.clients import async_openai
from rllm.sdk.sandbox import SandboxSpec

@rollout
async def five_turns(task, config):
    messages = []
    async with async_openai(config, max_retries=0) as client:
        for turn in range(5):
            messages.append({"role": "user", "content": f"{task.instruction} turn {turn}"})
            reply = await client.chat.completions.create(model=config.model, messages=messages)
            messages.append({"role": "assistant", "content": reply.choices[0].message.content})
    return {"answer": messages[-1]["content"]}
"""


def turns(n: int):
    @rollout
    async def flow(task: Task, config: AgentConfig) -> dict:
        messages: list = []
        async with async_openai(config, max_retries=0) as c:
            for turn in range(n):
                messages.append({"role": "user", "content": f"{task.instruction} turn {turn}"})
                reply = await c.chat.completions.create(model=config.model, messages=messages)
                messages.append({"role": "assistant", "content": reply.choices[0].message.content})
        return {"answer": messages[-1]["content"]}

    return flow


async def measure(flow, upstream: str, rollouts: int, **config) -> tuple[list[float], list[float]]:
    """Per-rollout wall times and start-to-first-call times, one rollout at a time."""
    cfg = RolloutConfig(n=1, concurrency=1, progress=False, **config)
    walls, first = [], []
    async with RolloutEngine(flow, None, cfg, upstreams=[upstream]) as engine:
        await engine.run([Task(id="warm", instruction="hi")])  # connections, imports, caches
        for i in range(rollouts):
            ARRIVALS.clear()
            started = time.perf_counter()
            [episode] = await engine.run([Task(id=f"t{i}", instruction="hi")])
            walls.append(time.perf_counter() - started)
            assert episode.termination_reason == "done", episode.error
            first.append(min(ARRIVALS) - started)
    return walls, first


def _load() -> str:
    path = Path("/proc/loadavg")
    return path.read_text().split()[0] if path.exists() else "?"


def line(name: str, walls: list[float], peer: list[float] | None, first: list[float]) -> str:
    mean, median = statistics.mean(walls) * 1e3, statistics.median(walls) * 1e3
    out = f"{name:34s} mean {mean:8.1f} ms  median {median:8.1f} ms"
    if peer is not None:
        out += f"  x{statistics.mean(walls) / statistics.mean(peer):6.1f} the in-process flow"
        out += f"  (+{(statistics.mean(walls) - statistics.mean(peer)) * 1e3:.1f} ms)"
    if first:
        out += f"  start->first call {statistics.median(first) * 1e3:.1f} ms"
    return out


async def main(rollouts: int) -> None:
    def responder(body: dict) -> str:
        ARRIVALS.append(time.perf_counter())
        return "ok"

    upstream = await MockUpstream(responder=responder).start()
    tmp = Path(tempfile.mkdtemp(prefix="rllm-bench-"))
    (tmp / "harness.py").write_text(PY_HARNESS)
    (tmp / "bench_agent.py").write_text(AGENT_MODULE)
    print(
        f"harness overhead, {rollouts} rollouts each, {platform.machine()}, {os.cpu_count()} CPUs "
        f"(load average {_load()}), Python {platform.python_version()}"
    )
    try:
        one, first_one = await measure(turns(1), upstream.url, rollouts)
        print(line("in-process @rollout, 1 call", one, None, first_one))
        py, first_py = await measure(
            command_flow([sys.executable, str(tmp / "harness.py"), "hi"]), upstream.url, rollouts
        )
        print(line("command: python + openai, 1 call", py, one, first_py))
        sh, first_sh = await measure(
            command_flow(["bash", "-c", CURL_HARNESS, "h", "hi"]), upstream.url, rollouts
        )
        print(line("command: bash + curl, 1 call", sh, one, first_sh))
        if shutil.which("bwrap") and shutil.which("prlimit"):
            # The same harness inside a bwrap sandbox per rollout (one prepared ahead, as with
            # rollout.sandbox_warm), reaching its session through the gateway bridge.
            boxed, first_boxed = await measure(
                command_flow(["bash", "-c", CURL_HARNESS, "h", "hi"], sandbox=SandboxSpec()),
                upstream.url,
                rollouts,
                sandbox_warm=1,
            )
            print(line("command: bash + curl, in a sandbox", boxed, one, first_boxed))
            print(
                f"{'':34s} sandbox + bridge over the same harness unsandboxed: "
                f"x{statistics.mean(boxed) / statistics.mean(sh):.2f} "
                f"(+{(statistics.mean(boxed) - statistics.mean(sh)) * 1e3:.1f} ms)"
            )
        five, first_five = await measure(turns(5), upstream.url, rollouts)
        print(line("in-process @rollout, 5 turns", five, None, first_five))
        env = {**os.environ, "PYTHONPATH": str(tmp)}
        cmd = [
            sys.executable,
            "-m",
            "rllm.cli.main",
            "agent",
            "serve",
            "bench_agent:five_turns",
            "--port",
            "0",
        ]
        service = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
        try:
            assert service.stdout is not None
            url = service.stdout.readline().strip().rsplit(" ", 1)[1]
            remote, first_remote = await measure(
                None, upstream.url, rollouts, executor="remote", remote=RemoteSettings(urls=[url])
            )
            print(line("remote service, 5 turns", remote, five, first_remote))
        finally:
            service.terminate()
            service.wait()
    finally:
        await upstream.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description="per-rollout overhead of command harnesses and remote agents"
    )
    parser.add_argument("--rollouts", type=int, default=20)
    asyncio.run(main(parser.parse_args().rollouts))
