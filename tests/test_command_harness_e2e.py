"""Command harnesses train end to end: a Python script with the openai client and a bash script
with curl, each started as a process per rollout (rllm.sdk.command_flow), train 2 steps of the
one-turn say task on the tiny model with the local backend; their calls reach the trainer
token-true (the trainer's logprobs match the sampler's on the captured ids)."""

from __future__ import annotations

import asyncio
import shutil
import sys
from pathlib import Path

import pytest
from rllm_cookbook_say import TRAIN_DEFAULTS, load_tasks

from rllm.engine.training.launch import build_trainer
from rllm.engine.training.metrics_log import read_metrics
from rllm.sdk import Cookbook, EvalOutput, Task, command_flow, evaluator, final_answer
from rllm.sdk.sandbox import SandboxSpec
from rllm.types import Episode

pytestmark = pytest.mark.slow

PY_HARNESS = """
import os, sys
from openai import OpenAI

reply = OpenAI(max_retries=0).chat.completions.create(
    model=os.environ["OPENAI_MODEL"], messages=[{"role": "user", "content": sys.argv[1]}]
)
print(reply.choices[0].message.content)
"""

CURL_HARNESS = r"""
set -euo pipefail
body=$(printf '{"model": "%s", "messages": [{"role": "user", "content": "%s"}]}' "$OPENAI_MODEL" "$1")
curl -sSf "$OPENAI_BASE_URL/chat/completions" -H "Authorization: Bearer $OPENAI_API_KEY" \
  -H 'Content-Type: application/json' -d "$body" \
  | grep -o '"content": *"[^"]*"' | head -n 1 | sed 's/^"content": *"//; s/"$//'
"""

FAST = [
    "progress=false",
    "plot=false",
    "tensorboard=false",
    "val_every=0",
    "ckpt_every=0",
    "total_steps=2",
    "tasks_per_step=2",
    "group_size=2",
    "rollout.workers=1",
    # A random model rarely scores: keep every group so each step trains.
    "algorithm.filter_zero_variance=false",
]


@evaluator
def says_the_word(task: Task, episode: Episode) -> EvalOutput:
    words = final_answer(episode).split()
    hit = bool(words) and words[0] == task.metadata["words"][0]
    return EvalOutput(reward=float(hit), is_correct=hit)


def harness_cookbook(argv: list[str], sandbox: SandboxSpec | None = None) -> Cookbook:
    return Cookbook(
        name="say-command",
        flow=command_flow(argv, timeout_s=120, sandbox=sandbox),
        evaluator=says_the_word,
        load_tasks=lambda split: load_tasks(split, turns=1),
        train_defaults=TRAIN_DEFAULTS,
    )


def train_two_steps(argv: list[str], out: Path, sandbox: SandboxSpec | None = None) -> list[dict]:
    cookbook = harness_cookbook(argv, sandbox)
    trainer = build_trainer("say-command", out_dir=str(out), overrides=FAST, cookbook=cookbook)
    asyncio.run(trainer.fit())
    return read_metrics(out / "metrics.jsonl")


def assert_trained_token_true(rows: list[dict]) -> None:
    assert len(rows) == 2
    for row in rows:
        assert row["termination/done"] == 1.0, row  # every process exited 0 with an answer
        assert row["train/sequences"] == 4
        # The trainer scored exactly the sampler's token ids the gateway captured.
        assert row["mismatch/tokens"] > 0
        assert row["mismatch/mean_abs"] < 1e-3, row
    assert rows[-1]["weight_version"] >= 1


def test_python_openai_harness_trains_two_steps(tmp_path: Path) -> None:
    script = tmp_path / "harness.py"
    script.write_text(PY_HARNESS)
    assert_trained_token_true(
        train_two_steps([sys.executable, str(script), "{instruction}"], tmp_path / "run")
    )


def test_bash_curl_harness_trains_two_steps(tmp_path: Path) -> None:
    rows = train_two_steps(["bash", "-c", CURL_HARNESS, "harness", "{instruction}"], tmp_path / "run")
    assert_trained_token_true(rows)


@pytest.mark.skipif(
    shutil.which("bwrap") is None or shutil.which("prlimit") is None,
    reason="bubblewrap (bwrap) and prlimit are not installed: apt-get install bubblewrap",
)
def test_bash_curl_harness_in_a_bwrap_sandbox_trains_two_steps(tmp_path: Path) -> None:
    # The same harness, each rollout inside its own sandbox: no network, only the bridge to its
    # session (OPENAI_BASE_URL is a loopback URL inside the sandbox).
    rows = train_two_steps(
        ["bash", "-c", CURL_HARNESS, "harness", "{instruction}"], tmp_path / "run", sandbox=SandboxSpec()
    )
    assert_trained_token_true(rows)
