"""The `rllm` command's argument handling and error reporting (no training here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rllm.cli.main import main


def test_view_summarises_metrics(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [{"step": i, "reward/mean": i / 10, "train/loss": 0.1} for i in range(1, 6)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    assert main(["view", str(tmp_path), "--table"]) == 0
    out = capsys.readouterr().out
    assert "reward" in out and "0.500" in out


def test_view_of_an_empty_run_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["view", str(tmp_path)]) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err


def test_bad_config_file_names_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "run.toml"
    config.write_text("total_steps = 3\n[algorithm]\nclip_low = 'wide'\n")
    assert main(["train", "say", "--config", str(config), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "algorithm.clip_low" in err and "float" in err


def test_unknown_backend_lists_installed_ones(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "say", "--backend", "deepspeed", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no backend named 'deepspeed'" in err and "tinker" in err and "verl" in err


def test_unknown_arguments_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["view", "somewhere", "--bogus"])


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max-tokens", "0"], "max_tokens must be >= 1"),
        (["--temperature", "-1"], "temperature must be >= 0"),
        (["--workers", "0"], "workers must be >= 1"),
        (["--concurrency", "0"], "concurrency must be >= 1"),
    ],
)
def test_eval_refuses_bad_settings_before_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    out = tmp_path / "eval"
    assert main(["eval", "say", "--base-url", "http://127.0.0.1:9/v1", "--out", str(out), *flags]) == 2
    assert message in capsys.readouterr().err
    assert not (out / "results.jsonl").exists()


def test_cookbook_options_are_refused_where_they_do_not_fit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", "say", "--out", str(tmp_path / "run"), "cookbook_options.judge_model=x"]) == 2
    err = capsys.readouterr().err
    assert "cookbook_options" in err and "takes no options, got judge_model" in err
    assert "['" not in err  # valid and given values as plain words, not a Python list
    args = ["eval", "finqa", "--base-url", "http://127.0.0.1:9/v1", "--out", str(tmp_path / "e")]
    assert main([*args, "--option", "judge_temperature=0"]) == 2
    assert "judge_temperature" in capsys.readouterr().err
    assert main([*args, "--option", "no-equals-sign"]) == 2
    assert "not of the form" in capsys.readouterr().err
    assert not (tmp_path / "e" / "results.jsonl").exists()


def test_debug_shows_a_traceback_for_errors_raised_as_cli_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLLM_HOME", str(tmp_path / "home"))
    assert main(["--debug", "dataset", "inspect", "nope"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "no registered dataset named 'nope'" in err
    assert main(["dataset", "inspect", "nope"]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_third_party_noise_is_off_unless_debug(monkeypatch: pytest.MonkeyPatch) -> None:
    import logging

    from rllm.cli.quiet import QUIET_ENV, QUIET_LOGGERS

    for name in QUIET_ENV:
        monkeypatch.delenv(name, raising=False)
    loggers = [logging.getLogger(name) for name in QUIET_LOGGERS]
    before = [lg.level for lg in loggers]
    try:
        for lg in loggers:
            lg.setLevel(logging.NOTSET)
        assert main(["--debug", "cookbooks"]) == 0
        assert "HF_HUB_DISABLE_PROGRESS_BARS" not in __import__("os").environ
        assert logging.getLogger("rllm.engine.rollout.loop_lag").getEffectiveLevel() <= logging.WARNING
        assert main(["cookbooks"]) == 0
        assert __import__("os").environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
        for name in ("rllm.engine.rollout.loop_lag", "LiteLLM", "math_verify.parser"):
            assert logging.getLogger(name).getEffectiveLevel() == logging.ERROR, name
    finally:
        for lg, level in zip(loggers, before, strict=True):
            lg.setLevel(level)
