"""`rllm train judge-say` end to end: the reward comes from a real judge model served by
`rllm serve` (a separate process), through the real openai client and rllm.sdk.rewards' group
judge.

The judge is the tiny model, fine-tuned here (`rllm sft`, a few seconds on CPU) to answer the
group judge's prompt in its format ("SCORE 1: 7 / SCORE 2: 3") whatever the replies say: a
random tiny model's replies would be refused by the strict parser every time. What is checked is
the plumbing, not the judge's taste: every episode of both steps is scored by the judge (no
infra_error), the group gets one call and relative scores, and the judge's tokens are counted in
the step's metrics. A judge that is down refuses the run before anything is built.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from rllm_cookbook_judge_say import RUBRIC, WORDS

from rllm.engine.data.sft_launch import build_sft
from rllm.engine.training.launch import build_trainer
from rllm.engine.training.metrics_log import read_metrics
from rllm.sdk.rewards import GroupJudge, JudgeEndpoint
from rllm.types import ConfigError, Episode, Task

FAST = ["progress=false", "plot=false", "tensorboard=false", "val_every=0"]
VERDICT = "SCORE 1: 7\nSCORE 2: 3"


def fine_tune_the_judge(out: Path) -> Path:
    """The tiny model taught to answer every 2-reply group prompt with VERDICT."""
    judge = GroupJudge(JudgeEndpoint("http://unused/v1", "unused"), RUBRIC)
    rng = random.Random(0)
    rows = []
    for word in WORDS:
        replies = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 4))) for _ in range(2)]
        group = [
            Episode(task_id=word, rollout_index=i, artifacts={"answer": r}) for i, r in enumerate(replies)
        ]
        prompt = judge.messages(Task(id=word, instruction=f"say: {word}", ground_truth=word), group)
        rows.append({"messages": [*prompt, {"role": "assistant", "content": VERDICT}]})
    chats = out / "judge_chats.jsonl"
    chats.write_text("".join(json.dumps(row) + "\n" for row in rows))
    overrides = ["progress=false", "epochs=30", "backend.options.learning_rate=0.003"]
    result = asyncio.run(build_sft(str(chats), out_dir=str(out / "judge"), overrides=overrides).fit())
    assert result.final_loss is not None and result.final_loss < 0.2, result
    return out / "judge"


@pytest.mark.slow
def test_train_two_steps_on_a_group_judges_reward(tmp_path: Path) -> None:
    judge_run = fine_tune_the_judge(tmp_path)
    serve = [
        sys.executable,
        "-m",
        "rllm.cli.main",
        "serve",
        str(judge_run),
        "--port",
        "0",
        "--model-name",
        "judge",
    ]
    proc = subprocess.Popen(serve, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # printed once the server listens
        assert " at http://127.0.0.1:" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
        judge_url = line.split(" at ", 1)[1].strip()
        out = tmp_path / "run"
        options = [
            f"cookbook_options.judge_base_url={judge_url}",
            "cookbook_options.judge_model=judge",
            "cookbook_options.judge_group_size=2",
            f"cookbook_options.judge_cache={tmp_path / 'judge-cache.db'}",
        ]
        small = ["total_steps=2", "tasks_per_step=2", "group_size=2", "rollout.sampling.max_tokens=3"]
        trainer = build_trainer("judge-say", out_dir=str(out), overrides=[*FAST, *small, *options])
        asyncio.run(trainer.fit())
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    rows = read_metrics(out / "metrics.jsonl")
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:
        assert row["termination/done"] == 1.0 and row["episodes"] == 4, row  # every episode judged
        assert row["train/sequences"] >= 4
        # The judge's relative scores: 0.7 for each group's first reply, 0.3 for its second.
        assert row["reward/max"] == pytest.approx(0.7) and row["reward/min"] == pytest.approx(0.3)
        # One judge call per group, its tokens shared among the group's episodes.
        assert row["signal/judge/calls"] + row["signal/judge/cache_hits"] == pytest.approx(0.5)
        assert row["signal/judge/prompt_tokens"] > 50 and row["signal/judge/completion_tokens"] > 0
        assert row["signal/judge/group_size"] == 2


def test_a_judge_that_is_down_refuses_the_run_before_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RLLM_JUDGE_BASE_URL", raising=False)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    options = [f"cookbook_options.judge_base_url={dead}", "cookbook_options.judge_model=judge"]
    with pytest.raises(ConfigError, match=r"judge-say's judge: judge endpoint .* is unreachable"):
        build_trainer("judge-say", out_dir=str(tmp_path / "run"), overrides=[*FAST, *options])
    with pytest.raises(ConfigError, match="judge-say needs a judge"):
        build_trainer("judge-say", out_dir=str(tmp_path / "run"), overrides=FAST)
    assert not (tmp_path / "run").exists()
