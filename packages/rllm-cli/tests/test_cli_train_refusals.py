"""`rllm train` refuses, before it builds or writes anything, what it cannot do as asked.

No training runs here: each case must stop before the tiny model is built, so none leaves a
``tiny-model/`` folder (or any folder) behind.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rllm.cli.main import main
from rllm.engine.training.checkpoint import checkpoint_dir


def _err(capsys: pytest.CaptureFixture[str]) -> str:
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("override", "names"),
    [
        ("backend.options.learning_rat=0.1", ["backend.options", "learning_rat"]),
        ("backend.options.lora.rnak=4", ["backend.options", "rnak"]),
        ("algorithm.estimator=foo", ["estimator", "foo"]),
        ("rollout.sampling.temprature=0.5", ["rollout.sampling.temprature", "unknown key"]),
    ],
)
def test_bad_options_are_refused_before_anything_is_built(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], override: str, names: list[str]
) -> None:
    out = tmp_path / "run"
    assert main(["train", "say", "--out", str(out), override]) == 2
    err = _err(capsys)
    assert all(n in err for n in names), err
    assert not out.exists()  # not even tiny-model/


def test_resume_without_a_run_folder_names_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "never-ran"
    assert main(["train", "say", "--out", str(out), "--resume"]) == 2
    err = _err(capsys)
    assert "--resume" in err and str(out) in err and "does not exist" in err
    assert not out.exists()


def test_resume_without_a_checkpoint_names_what_is_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.0}\n')
    # A checkpoint cut short by a kill (no trainer_state.json) is not one to resume from.
    (checkpoint_dir(out, 5) / "backend").mkdir(parents=True)
    assert main(["train", "say", "--out", str(out), "--resume"]) == 2
    err = _err(capsys)
    assert "no complete checkpoint" in err and "nothing to resume" in err
    assert not (out / "tiny-model").exists()


def test_an_earlier_run_is_not_silently_replaced(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    (out / "samples").mkdir(parents=True)
    (out / "samples" / "step_000001.msgpack").write_bytes(b"earlier")
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    assert main(["train", "say", "--out", str(out)]) == 2
    err = _err(capsys)
    assert "already holds a training run" in err and "--resume" in err and "--overwrite" in err
    assert (out / "samples" / "step_000001.msgpack").read_bytes() == b"earlier"


def test_resume_and_overwrite_together_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", "say", "--out", str(tmp_path / "r"), "--resume", "--overwrite"]) == 2
    assert "contradict" in _err(capsys)


def test_a_missing_config_file_has_no_unrelated_hint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", "say", "--config", str(tmp_path / "missing.toml")]) == 2
    err = _err(capsys)
    assert "does not exist" in err and "TrainerConfig" not in err


def test_a_complete_checkpoint_is_what_resume_finds(tmp_path: Path) -> None:
    from rllm.engine.training.checkpoint import latest_checkpoint
    from rllm.engine.training.run_folder import RunFolder

    ckpt = checkpoint_dir(tmp_path, 3)
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_bytes(b'{"step": 3}')
    RunFolder(tmp_path, "train").check(resume=True)
    assert latest_checkpoint(tmp_path) == ckpt
