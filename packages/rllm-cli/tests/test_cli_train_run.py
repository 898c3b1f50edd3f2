"""`rllm train` end to end on the tiny model: a run that cannot learn says so, every run ends
with a checkpoint, a re-run is refused, and --resume continues from the final checkpoint."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import pytest

from rllm.cli.main import main
from rllm.engine.training.learning_watch import TaskOutcomes
from rllm.engine.training.metrics_log import read_metrics

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
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "run"
    # Tasks count as unrewarded after one appearance here (5 by default), so 3 steps show it.
    monkeypatch.setattr(
        "rllm.engine.training.task_sampler.TaskOutcomes", partial(TaskOutcomes, appearances=1)
    )
    assert main(["train", "say-single", "--out", str(out), "total_steps=3", *QUICK]) == 0
    err = capsys.readouterr().err
    assert err.count("no learning signal in 3 steps in a row") == 2  # as it happens, and in the summary
    # The fresh tiny model rarely says the word: the tasks of the last step that got no reward
    # are counted in its metrics and named in the end-of-run warning, and only those.
    unrewarded = int(read_metrics(out / "metrics.jsonl")[-1]["filter/tasks_unrewarded"])
    assert (f"{unrewarded} task(s) got no reward" in err) == (unrewarded > 0), err
    assert (out / "checkpoints" / "step_000003" / "trainer_state.json").is_file()  # ckpt_every is 0
    assert "checkpoint " in err and "step_000003" in err, err
    rows = read_metrics(out / "metrics.jsonl")
    assert [(r["train/sequences"], r["train/signal_sequences"]) for r in rows] == [(0, 0)] * 3
    assert "warning/health/zero_advantage" in rows[2] and rows[2]["health/zero_advantage"] == 1.0

    assert main(["train", "say-single", "--out", str(out), "total_steps=3", *QUICK]) == 2
    assert "already holds a training run" in capsys.readouterr().err

    # More steps, fewer checkpoints kept: changes --resume takes only when asked (--allow-changes).
    # keep_checkpoints=1: the step-3 checkpoint goes when step 4's is written, and the run says so.
    resumed = ["--resume", "total_steps=4", "keep_checkpoints=1", *QUICK]
    assert main(["train", "say-single", "--out", str(out), *resumed]) == 2
    assert "total_steps (run: 3, now: 4)" in capsys.readouterr().err
    allowed = ["--allow-changes", "total_steps,keep_checkpoints"]
    assert main(["train", "say-single", "--out", str(out), *resumed, *allowed]) == 0
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2, 3, 4]
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step_000004"]
    err = capsys.readouterr().err
    assert "step_000003 removed (keep_checkpoints=1 keeps the newest 1)" in err, err


def test_an_interrupted_run_keeps_its_finished_steps(tmp_path: Path) -> None:
    """Ctrl-C cancels the run during a step's rollouts: the steps already done are checkpointed
    (ckpt_every is 0, so nothing else would be) and --resume goes on from there."""
    import asyncio

    from rllm.engine.rollout.rollout_engine import RolloutEngine
    from rllm.engine.training.checkpoint import TrainerState
    from rllm.engine.training.launch import build_trainer
    from rllm.engine.training.trainer import Trainer

    out = tmp_path / "run"
    trainer = build_trainer("say-single", out_dir=str(out), overrides=["total_steps=50", *QUICK])
    original = Trainer._train_one_step
    two_done = asyncio.Event()

    async def counted(self: Trainer, engine: RolloutEngine, state: TrainerState) -> dict[str, Any]:
        if state.step == 2:
            two_done.set()  # the third step's rollouts are about to start
        return await original(self, engine, state)

    async def interrupt() -> None:
        fit = asyncio.create_task(trainer.fit())
        await two_done.wait()
        fit.cancel()
        with pytest.raises(asyncio.CancelledError):
            await fit

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Trainer, "_train_one_step", counted)
        asyncio.run(interrupt())
    state = (out / "checkpoints" / "step_000002" / "trainer_state.json").read_text()
    assert '"step":2' in state.replace(" ", "")
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2]


def test_a_task_drawn_twice_in_a_step_makes_two_groups_of_group_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """say-single has 8 tasks: 16 a step draws each twice. Each drawing is its own group of
    group_size=2 (16 groups), said once at the start; they used to be merged into 8 groups of 4."""
    out = tmp_path / "run"
    args = ["train", "say-single", "--out", str(out), "total_steps=1", *QUICK, "tasks_per_step=16"]
    assert main([*args, "algorithm.min_group_size=2"]) == 0
    err = capsys.readouterr().err
    note = "note: tasks_per_step=16 is more than the 8 tasks of split 'train'"
    assert err.count(note) == 1 and "each drawing its own group of group_size=2" in err, err
    (row,) = read_metrics(out / "metrics.jsonl")
    assert row["filter/groups_in"] == 16 and row["episodes"] == 32, row
