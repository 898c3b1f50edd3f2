"""Cookbook tests: the flow and evaluator against a scripted loopback model, and 2 training steps.

The scripted model is the gateway's MockUpstream (a real OpenAI-compatible HTTP server on
loopback) with a responder that answers right for some tasks and wrong for others; the rollout
engine runs the cookbook's own flow and evaluator through a real gateway.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rllm.engine.rollout.rollout_config import RolloutConfig
from rllm.engine.rollout.rollout_engine import RolloutEngine
from rllm.engine.training.launch import build_trainer
from rllm.engine.training.metrics_log import read_metrics
from rllm.testing import MockUpstream
from rllm.types import Episode, SamplingParams, Task

FAST = ["progress=false", "plot=false", "tensorboard=false"]


async def run_scripted(
    cookbook: Any, tasks: list[Task], responder: Callable[[dict], Any], *, max_retries: int = 0
) -> list[Episode]:
    """One episode per task, the model's replies coming from ``responder(request_body)``."""
    async with MockUpstream(responder=responder) as mock:
        config = RolloutConfig(
            n=1,
            concurrency=8,
            progress=False,
            max_retries=max_retries,
            retry_backoff_s=0.01,
            sampling=SamplingParams(max_tokens=4096),
        )
        async with RolloutEngine(cookbook.flow, cookbook.evaluator, config, upstreams=[mock.url]) as engine:
            return await engine.run(tasks)


def train_two_steps(name: str, out: Path, *overrides: str) -> list[dict[str, Any]]:
    """2 training steps on the local tinker backend (tiny model, cumulative-mode gateway)."""
    trainer = build_trainer(
        name,
        out_dir=str(out),
        overrides=[
            *FAST,
            "total_steps=2",
            "tasks_per_step=2",
            "group_size=2",
            "val_every=0",
            "rollout.sampling.max_tokens=6",
            # A random tiny model earns the same reward everywhere; train on its episodes anyway.
            "algorithm.filter_zero_variance=false",
            *overrides,
        ],
    )
    assert trainer.config.gateway.mode == "cumulative"
    asyncio.run(trainer.fit())
    rows = read_metrics(out / "metrics.jsonl")
    assert [row["step"] for row in rows] == [1, 2]
    assert all(row["train/sequences"] >= row["episodes"] > 0 for row in rows), rows
    return rows


@pytest.fixture
def scripted():
    return run_scripted


@pytest.fixture
def train():
    return train_two_steps
