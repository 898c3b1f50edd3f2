"""`rllm serve MODEL_PATH` as a real process: a tiny local model answers the openai client and
`rllm eval`, then SIGINT stops it cleanly. The backend is found through `rllm.serve`."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from openai import OpenAI

from rllm.cli.main import cli


def rllm(*args: str) -> list[str]:
    return [sys.executable, "-m", "rllm.cli.main", *args]


@pytest.mark.slow
def test_serve_a_tiny_model_for_eval_and_people(tmp_path: Path) -> None:
    model = tmp_path / "tiny"
    # Built in this process (the command is the same): one interpreter start with torch less.
    made = CliRunner().invoke(cli, ["model", "init-tiny", str(model), "--cookbook", "say-single"])
    assert made.exit_code == 0, made.output
    proc = subprocess.Popen(
        rllm("serve", str(model), "--port", "0"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the server prints its URL once it is listening
        assert line.startswith("serving tiny at http://127.0.0.1:"), (
            line,
            proc.stderr.read() if proc.poll() is not None else "",
        )
        base_url = line.split(" at ", 1)[1].strip()
        reply = OpenAI(base_url=base_url, api_key="none").chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "say: apple"}], max_tokens=3
        )
        assert reply.choices[0].message.content is not None and reply.usage.completion_tokens >= 1

        out = tmp_path / "eval"
        result = CliRunner().invoke(
            cli,
            [
                "eval",
                "say-single",
                "--base-url",
                base_url,
                "--out",
                str(out),
                "--max-examples",
                "2",
                "--no-progress",
            ],
        )
        assert result.exit_code == 0, result.output
        summary = json.loads((out / "summary.json").read_text())
        assert summary["num_tasks"] == 2 and summary["termination"] == {"done": 2}
        assert "accuracy" in result.stdout
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    assert proc.returncode == 0


def test_serve_refuses_a_path_that_is_not_a_model(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["serve", str(tmp_path / "nope")])
    assert result.exit_code == 2 and "does not exist" in result.stderr


def test_serve_names_the_backends_that_can_serve(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["serve", str(tmp_path), "--backend", "verl"])
    assert result.exit_code == 2 and "no backend named 'verl' can serve" in result.stderr
    assert "tinker" in result.stderr
