"""`rllm` as a real subprocess: the console script, exit codes, stderr, a dataset round trip."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def rllm(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RLLM_HOME": str(home), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "rllm.cli.main", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_dataset_round_trip_as_a_subprocess(tmp_path: Path) -> None:
    source = tmp_path / "q.jsonl"
    source.write_text("".join(json.dumps({"question": f"q{i}", "answer": i}) + "\n" for i in range(4)))
    done = rllm("dataset", "register", "qs", str(source), home=tmp_path)
    assert done.returncode == 0, done.stderr
    done = rllm("dataset", "inspect", "qs", "-n", "2", home=tmp_path)
    assert done.returncode == 0 and "q1" in done.stdout and "q2" not in done.stdout
    assert rllm("dataset", "remove", "qs", home=tmp_path).returncode == 0
    assert "qs" not in rllm("dataset", "list", home=tmp_path).stdout


def test_error_paths_exit_2_with_one_line(tmp_path: Path) -> None:
    bad_column = tmp_path / "q.jsonl"
    bad_column.write_text(json.dumps({"prompt": "x"}) + "\n")
    cases = [
        (["dataset", "register", "qs", str(bad_column)], "no column 'question'"),
        (["dataset", "register", "qs", str(tmp_path / "nope.csv")], "does not exist"),
        (["cookbook", "info", "nope"], "no cookbook named 'nope'"),
        (["train", "say", "--out", str(tmp_path / "run"), "nope.key=1"], "config key `nope`"),
    ]
    for args, message in cases:
        done = rllm(*args, home=tmp_path)
        assert done.returncode == 2, (args, done.stderr)
        assert message in done.stderr and "Traceback" not in done.stderr, (args, done.stderr)
        # datasets' own progress bars may come first; the error itself is one line.
        errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and message in errors[0], done.stderr


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    done = rllm("view", str(tmp_path), "--bogus", home=tmp_path)
    assert done.returncode == 2 and "--bogus" in done.stderr
    assert rllm("--version", home=tmp_path).stdout.startswith("rllm")
