"""The plain progress lines a run prints when stderr is not a terminal (a log, CI, a pipe): the
first step at once (the main job used to be silent until step 20), then about ten per run, and
the figure the run trains on: the reward for RL, the loss for SFT (it used to say
``reward 0.000`` at every SFT step)."""

from __future__ import annotations

import pytest

from rllm.engine.training.train_progress import LOSS, TrainProgress


def _lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return capsys.readouterr().err.splitlines()


def test_the_first_step_is_said_at_once_then_about_ten_lines_per_run(capsys) -> None:
    with TrainProgress(200) as progress:
        for step in range(1, 201):
            progress.update(step, {"reward/mean": step / 200, "time/rollout_s": 1.0, "time/train_s": 0.5})
    lines = _lines(capsys)
    assert lines[0] == "step 1/200  reward 0.005  1.50 s/step"
    assert [line.split()[1] for line in lines] == ["1/200", *(f"{s}/200" for s in range(20, 201, 20))]


def test_a_resumed_run_says_its_first_step_too(capsys) -> None:
    with TrainProgress(200, start=40) as progress:
        progress.update(41, {"reward/mean": 0.5})
    assert _lines(capsys) == ["step 41/200  reward 0.500  0.00 s/step"]


def test_sft_shows_its_loss_and_held_out_loss_not_a_reward(capsys) -> None:
    with TrainProgress(2, shown=LOSS) as progress:
        progress.update(1, {"train/loss": 2.5, "time/train_s": 0.25})
        progress.update(2, {"train/loss": 1.25, "val/loss": 1.5, "time/train_s": 0.25})
    assert _lines(capsys) == [
        "step 1/2  loss 2.500  0.25 s/step",
        "step 2/2  loss 1.250  val 1.500  0.25 s/step",
    ]
