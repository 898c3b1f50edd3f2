"""`rllm agent serve` as a real process, SIGKILLed while it runs rollouts: the engine retries
them on the other service; nothing is lost, nothing runs twice, no trace of the killed attempts
is kept."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import openai

from rllm.engine.rollout.agent_server import AgentServer
from rllm.engine.rollout.remote_executor import RemoteSettings
from rllm.engine.rollout.rollout_config import RolloutConfig
from rllm.engine.rollout.rollout_engine import RolloutEngine
from rllm.sdk import AgentConfig, Task, rollout
from rllm.testing import MockUpstream
from rllm.testing.waiting import wait_until
from rllm.types import TerminationReason

AGENT_MODULE = """
import asyncio, os, pathlib
import openai
from rllm.sdk import rollout

@rollout
async def held(task, config):
    async with openai.AsyncOpenAI(base_url=config.base_url, api_key=config.api_key, max_retries=0) as c:
        await c.chat.completions.create(model=config.model, messages=[{"role": "user", "content": task.instruction}])
    pathlib.Path(os.environ["HELD_DIR"], config.session_id).touch()  # called the model; now hangs
    await asyncio.Event().wait()
"""


@rollout
async def answers(task: Task, config: AgentConfig) -> dict:
    async with openai.AsyncOpenAI(base_url=config.base_url, api_key=config.api_key, max_retries=0) as c:
        reply = await c.chat.completions.create(
            model=config.model, messages=[{"role": "user", "content": str(task.instruction)}]
        )
    return {"answer": reply.choices[0].message.content}


async def test_a_killed_agent_service_loses_nothing(tmp_path: Path) -> None:
    (tmp_path / "held_agent.py").write_text(AGENT_MODULE)
    held = tmp_path / "held"
    held.mkdir()
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "HELD_DIR": str(held)}
    cmd = [sys.executable, "-m", "rllm.cli.main", "agent", "serve", "held_agent:held", "--port", "0"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
    upstream = await MockUpstream(responder=lambda body: "4").start()
    try:
        assert proc.stdout is not None
        line = await asyncio.to_thread(proc.stdout.readline)
        assert "http://" in line, line
        url_a = line.strip().rsplit(" ", 1)[1]
        async with AgentServer(answers) as service_b:
            config = RolloutConfig(
                n=2,
                concurrency=4,
                progress=False,
                retry_backoff_s=0.01,
                executor="remote",
                remote=RemoteSettings(urls=[url_a, service_b.url], health_interval_s=60),
            )
            tasks = [Task(id=f"t{i}", instruction=f"2+2? #{i}") for i in range(2)]
            async with RolloutEngine(None, None, config, upstreams=[upstream.url]) as engine:
                run = asyncio.create_task(engine.run(tasks))
                await wait_until(
                    lambda: len(list(held.iterdir())) == 2, what="the service holding 2 rollouts"
                )
                proc.send_signal(signal.SIGKILL)
                episodes = await run
                assert await engine.client.list_sessions() == []
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        await upstream.stop()
    assert sorted((e.task_id, e.rollout_index) for e in episodes) == [
        ("t0", 0),
        ("t0", 1),
        ("t1", 0),
        ("t1", 1),
    ]
    for ep in episodes:
        assert ep.termination_reason == TerminationReason.DONE, ep.error
        assert ep.metadata["remote"]["url"] == service_b.url
        assert len(ep.trajectories) == 1 and len(ep.trajectories[0].steps) == 1
    assert sorted(ep.metrics["attempts"] for ep in episodes) == [1.0, 1.0, 2.0, 2.0]
    assert service_b.served == 4
