"""`rllm distill` end to end on CPU: the student trains on a teacher's per-token advantages."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from rllm.backends.tinker import TinkerBackend
from rllm.cli.main import main
from rllm.engine.plugins import load_cookbook
from rllm.engine.training.launch import build_trainer, init_tiny_model
from rllm.engine.training.metrics_log import read_metrics
from rllm.tiny import init_tiny_model as init_tiny_words
from rllm.types import ConfigError


async def start(model: Path) -> TinkerBackend:
    backend = TinkerBackend({"model": str(model), "dtype": "float32", "torch_threads": 1})
    await backend.start()
    return backend


def test_distill_from_a_teacher_equal_to_the_student_and_a_mismatched_one(tmp_path: Path) -> None:
    model = init_tiny_model(tmp_path / "model", cookbook=load_cookbook("say-single"))
    other = init_tiny_words(tmp_path / "other", vocab_words=["quince", "zebra"], seed=1)
    same, different = asyncio.run(start(model)), asyncio.run(start(other))
    fast = ["progress=false", "plot=false", "tensorboard=false", "rollout.workers=1"]
    student = [f"backend.options.model={model}", "backend.options.dtype=float32", "total_steps=1"]
    try:
        out = tmp_path / "run"
        teacher = same.inference_urls()[0]
        assert main(["distill", "say-single", "--teacher", teacher, "--out", str(out), *fast, *student]) == 0
        (row,) = [r for r in read_metrics(out / "metrics.jsonl") if r["step"] == 1]
        # The teacher is the student's own initial weights: zero reverse KL on every trained token.
        assert row["distill/tokens"] > 0 and abs(row["distill/reverse_kl"]) < 1e-3
        # A student whose vocabulary has words the teacher's lacks (and the other way round).
        mismatch = [*fast, f"backend.options.model={other}", f"distill.teacher={teacher}"]
        with pytest.raises(ConfigError, match="tokenizes"):
            build_trainer("say-single", out_dir=str(tmp_path / "x"), overrides=mismatch)
        mismatch = [*fast, *student, f"distill.teacher={different.inference_urls()[0]}"]
        with pytest.raises(ConfigError, match="tokenizes"):
            build_trainer("say-single", out_dir=str(tmp_path / "x"), overrides=mismatch)
        assert main(["distill", "say-single", "--teacher", str(model), "--out", str(tmp_path / "y")]) != 0
    finally:
        asyncio.run(same.close())
        asyncio.run(different.close())


def test_the_recommended_topk_command_trains_one_sample_per_task_at_its_rate(tmp_path: Path) -> None:
    """The rllm-engine README's settings for distill.loss=topk (group_size=1, 3x RL's learning
    rate), as a user types them, through `rllm distill`: every task's one sample trains on the
    teacher's top-k (the teacher is the student's own initial weights, so the KL starts at 0)."""
    model = init_tiny_model(tmp_path / "model", cookbook=load_cookbook("say-single"))
    teacher = asyncio.run(start(model))
    fast = ["progress=false", "plot=false", "tensorboard=false", "rollout.workers=1"]
    recommended = ["distill.loss=topk", "group_size=1", "backend.options.learning_rate=3e-3"]
    student = [
        f"backend.options.model={model}",
        "backend.options.dtype=float32",
        "total_steps=2",
        "tasks_per_step=4",
    ]
    try:
        out = tmp_path / "run"
        url = teacher.inference_urls()[0]
        assert (
            main(
                ["distill", "say-single", "--teacher", url, "--out", str(out), *fast, *student, *recommended]
            )
            == 0
        )
        rows = {r["step"]: r for r in read_metrics(out / "metrics.jsonl") if "reward/mean" in r}  # the steps
        assert sorted(rows) == [1, 2]
        for row in rows.values():
            assert (
                row["episodes"] == 4 and row["train/num_sequences"] == 4
            )  # one sample per task, all trained
            assert row["train/lr"] == pytest.approx(3e-3)
            assert row["train/distill/topk_mass_teacher"] > 0
        assert abs(rows[1]["train/distill/topk_kl"]) < 1e-4  # the teacher's own weights: nothing to learn yet
    finally:
        asyncio.run(teacher.close())
