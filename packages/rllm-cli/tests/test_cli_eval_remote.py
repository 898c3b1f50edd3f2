"""`rllm eval --remote URL`: the cookbook's tasks and evaluator, the rollouts run by an agent
service (`rllm agent serve`, a real process serving the say cookbook's flow)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from rllm.cli.main import cli
from rllm.testing import MockUpstream


@pytest.fixture
def say_service() -> Iterator[str]:
    cmd = [sys.executable, "-m", "rllm.cli.main", "agent", "serve", "say-single", "--port", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "http://" in line, line
        yield line.strip().rsplit(" ", 1)[1]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_eval_runs_the_rollouts_on_the_agent_service(
    say_service: str, model_server: MockUpstream, tmp_path: Path
) -> None:
    out = tmp_path / "eval"
    flags = [
        "--base-url",
        model_server.url,
        "--remote",
        say_service,
        "--max-examples",
        "3",
        "--max-tokens",
        "16",
    ]
    flags.append("--no-progress")
    result = CliRunner().invoke(
        cli, ["eval", "say-single", "--out", str(out), *flags], catch_exceptions=False
    )
    assert result.exit_code == 0, result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_rollouts"] == 3 and summary["infra_errors"] == 0 and summary["accuracy"] == 1.0
    episodes = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert {ep["metadata"]["remote"]["url"] for ep in episodes} == {say_service}
    assert all(len(ep["trajectories"][0]["steps"]) == 1 for ep in episodes)  # the gateway's traces


def test_a_bad_remote_url_is_refused(model_server: MockUpstream, tmp_path: Path) -> None:
    flags = ["--base-url", model_server.url, "--remote", "ftp://x", "--no-progress"]
    result = CliRunner().invoke(cli, ["eval", "say-single", "--out", str(tmp_path / "e"), *flags])
    assert result.exit_code == 2 and "http://" in result.stderr
