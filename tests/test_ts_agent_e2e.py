"""Another language, for real: the TypeScript agent in examples/ts-agent (the official `openai`
npm package, a multi-turn tool-using loop, served over the remote agent protocol with Node's
standard library) trains 2 steps of the multi-turn say task on the tiny model through
``rollout.executor = "remote"``. Its packages come from the npm registry (``npm ci`` against the
committed package-lock.json); without node and npm the test fails, it is never skipped."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from rllm.engine.plugins import load_cookbook
from rllm.engine.training.launch import build_trainer, task_vocabulary
from rllm.engine.training.metrics_log import read_episode_sample, read_metrics, sample_path
from rllm.tiny import init_tiny_model

pytestmark = pytest.mark.slow

AGENT = Path(__file__).parents[1] / "examples" / "ts-agent"


def _npm(*args: str) -> None:
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        pytest.fail("node and npm are needed for the TypeScript agent (Debian: apt-get install nodejs npm)")
    done = subprocess.run([npm, *args], cwd=AGENT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"npm {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"


@pytest.fixture(scope="module")
def ts_agent() -> Iterator[str]:
    _npm("ci", "--no-audit", "--no-fund")
    _npm("run", "build")
    proc = subprocess.Popen(
        ["node", "dist/agent.js", "--port", "0"], cwd=AGENT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # printed once it listens
        assert "http://" in line, f"the agent did not start: {line!r}"
        yield line.strip().rsplit(" ", 1)[1]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_typescript_agent_trains_two_steps(ts_agent: str, tmp_path: Path) -> None:
    overrides = [
        "progress=false",
        "plot=false",
        "tensorboard=false",
        "val_every=0",
        "ckpt_every=0",
        "total_steps=2",
        "tasks_per_step=4",
        "group_size=2",
        "rollout.workers=1",
        "sample_groups=4",
        "algorithm.filter_zero_variance=false",
        "rollout.executor=remote",
        f"rollout.remote.urls={json.dumps([ts_agent])}",
    ]
    # The agent sends `tools`: the tiny model gets the hermes tool-call chat template, which the
    # gateway's cumulative mode parses (given as the run's model: a run's own tiny model is the
    # trainer's to build, from its words and seed).
    model = tmp_path / "tool-call-model"
    init_tiny_model(model, vocab_words=task_vocabulary(load_cookbook("say")), tool_calls=True)
    run = tmp_path / "run"
    trainer = build_trainer("say", out_dir=str(run), overrides=[*overrides, f"backend.options.model={model}"])
    asyncio.run(trainer.fit())
    rows = read_metrics(run / "metrics.jsonl")
    assert len(rows) == 2
    for row in rows:
        assert row["termination/done"] == 1.0, row
        assert row["train/sequences"] >= 8  # a tool call's turn may start a new sequence
        assert row["mismatch/tokens"] > 0 and row["mismatch/mean_abs"] < 1e-3, row
    assert rows[-1]["weight_version"] >= 1
    sample = read_episode_sample(sample_path(run, 2))
    for episode in sample.episodes:
        # The TypeScript agent's own answer (a reply per word, its tool-call counter) and every
        # model call of its loop as a step (one per word, more when it called tools).
        assert episode.metadata["remote"]["url"] == ts_agent
        assert len(episode.artifacts["replies"]) == 2 and "tool_calls" in episode.artifacts
        steps = sum(len(t.steps) for t in episode.trajectories)
        assert steps >= 2 and (steps == 2) == (episode.artifacts["tool_calls"] == 0)
