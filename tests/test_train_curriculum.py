"""rollout.curriculum and algorithm.dynamic_sampling end to end on CPU: the tiny model, the
say-single cookbook, the real gateway, sampler and optimizer, the Trainer in-process.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest

from rllm.engine.training.checkpoint import load_trainer_state
from rllm.engine.training.launch import build_trainer
from rllm.engine.training.metrics_log import read_metrics

pytestmark = pytest.mark.slow

# One request per sampler forward and seeded sampling: two runs see the same tokens
# (tests/test_train_async.py's settings).
DETERMINISTIC = [
    "progress=false",
    "plot=false",
    "tensorboard=false",
    "seed=0",
    "tasks_per_step=4",
    "group_size=4",
    "val_every=0",
    "rollout.sampling.seed=7",
    "backend.options.sampler_max_batch=1",
    "rollout.workers=1",
    "sample_groups=0",
]
BOTH = [
    "rollout.curriculum.enabled=true",
    "rollout.curriculum.window=8",
    "algorithm.dynamic_sampling.enabled=true",
    "algorithm.dynamic_sampling.max_extra_groups=4",
]
# What a step's draw decided, and what it saw.
DRAWN = ("batch/task_ids", "curriculum/", "dynamic_sampling/", "reward/", "filter/tasks_unrewarded")


def _drawn(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k.startswith(DRAWN)} for row in rows]


def test_a_resumed_run_draws_the_tasks_the_uninterrupted_run_draws(tmp_path: Path) -> None:
    overrides = [*DETERMINISTIC, *BOTH, "ckpt_every=2"]
    whole = build_trainer(
        "say-single", out_dir=str(tmp_path / "whole"), overrides=[*overrides, "total_steps=4"]
    )
    asyncio.run(whole.fit())
    part = tmp_path / "part"
    first = build_trainer("say-single", out_dir=str(part), overrides=[*overrides, "total_steps=2"])
    asyncio.run(first.fit())
    # The checkpoint holds the sampler: each task's recent rewards, and the cursor's draw count.
    saved = load_trainer_state(part / "checkpoints" / "step_000002")
    assert saved.data.draws >= 8 and saved.sampler.tasks
    reference = load_trainer_state(tmp_path / "whole" / "checkpoints" / "step_000002")
    assert msgspec.json.encode(saved.sampler) == msgspec.json.encode(reference.sampler)
    resumed = build_trainer("say-single", out_dir=str(part), overrides=[*overrides, "total_steps=4"])
    asyncio.run(resumed.fit(resume=True, allow_changes=["total_steps"]))
    rows = {name: read_metrics(tmp_path / name / "metrics.jsonl") for name in ("whole", "part")}
    assert [r["step"] for r in rows["part"]] == [1, 2, 3, 4]
    assert _drawn(rows["part"]) == _drawn(rows["whole"])
    # The curriculum drew by its weights (not the epoch order) and dynamic sampling counted.
    assert all("curriculum/effective_tasks" in r and "dynamic_sampling/capped" in r for r in rows["part"])
    assert load_trainer_state(part / "checkpoints" / "step_000004").data.draws > saved.data.draws


def test_asynchronous_training_with_both_keeps_its_staleness_bound(tmp_path: Path) -> None:
    overrides = [*DETERMINISTIC, *BOTH, "rollout.max_staleness=1", "total_steps=3", "ckpt_every=0"]
    trainer = build_trainer("say-single", out_dir=str(tmp_path), overrides=overrides)
    asyncio.run(trainer.fit())
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert len(rows) == 3
    for row in rows:
        assert row["async/staleness_max"] <= 1
        groups = row["dynamic_sampling/groups"]
        assert 4 <= groups <= 8 and len(row["batch/task_ids"]) == groups == row["episodes"] / 4
        assert row["dynamic_sampling/signal_groups"] == 4 or row["dynamic_sampling/capped"] == 1.0
        assert "curriculum/effective_tasks" in row
