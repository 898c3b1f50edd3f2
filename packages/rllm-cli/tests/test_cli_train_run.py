"""`rllm train` end to end on the tiny model: a run that cannot learn says so, every run ends
with a checkpoint, a re-run is refused, and --resume continues from the final checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from rllm.cli.main import main
from rllm.engine.learning_watch import NoLearningWatch
from rllm.engine.metrics_log import read_metrics

pytestmark = pytest.mark.slow

QUICK = [
    "tasks_per_step=2",
    "group_size=2",
    "val_every=0",
    "rollout.workers=1",
    "progress=false",
    "plot=false",
    "tensorboard=false",
    "sample_groups=1",
    # Groups of 2 under a minimum of 3: every group is filtered out, every step trains nothing.
    "algorithm.min_group_size=3",
]


def test_a_run_that_cannot_learn_warns_checkpoints_and_resumes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    assert main(["train", "say-single", "--out", str(out), "total_steps=3", *QUICK]) == 0
    err = capsys.readouterr().err
    assert err.count("no trainable sequence in 3 steps in a row") == 2  # as it happens, and in the summary
    assert (out / "checkpoints" / "step_000003" / "trainer_state.json").is_file()  # ckpt_every is 0
    assert "checkpoint " in err and "step_000003" in err, err
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["train/sequences"] for r in rows] == [0, 0, 0]
    assert "warning/no_trainable_sequences" in rows[2]

    assert main(["train", "say-single", "--out", str(out), "total_steps=3", *QUICK]) == 2
    assert "already holds a run" in capsys.readouterr().err

    assert main(["train", "say-single", "--out", str(out), "--resume", "total_steps=4", *QUICK]) == 0
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2, 3, 4]
    assert (out / "checkpoints" / "step_000004").is_dir()


def test_the_no_learning_watch_warns_once_after_consecutive_idle_steps() -> None:
    watch = NoLearningWatch(steps=3)
    assert [watch.observe(n) for n in (0, 0, 4, 0, 0)] == [None] * 5  # a step that trained resets it
    warning = watch.observe(0)
    assert warning is not None and "3 steps in a row" in warning and "group_size" in warning
    assert watch.observe(0) is None  # once per run
