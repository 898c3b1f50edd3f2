"""Task directories in Harbor's own format (the `harbor` package's task.toml, schema 1.x, as
harbor 0.25's TaskConfig and TaskPaths define it): what maps onto rLLM's sandbox, run end to end
in a real bubblewrap sandbox, and every Harbor feature rLLM does not run refused by name.

The `harbor` package needs Python >= 3.12 and this workspace is 3.11, so the folders are written
here in its documented layout rather than produced by its own code."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rllm.engine.sandbox import BubblewrapBackend
from rllm.sdk.task_dir import TaskDirError, load_task_dir, run_verifier, task_sandbox_spec

HARBOR_TOML = """schema_version = "1.4"
source = "harbor-examples"

[task]
name = "acme/count-lines"
version = "1.0.0"
description = "Count the lines of a file."

[metadata]
difficulty = "easy"

[agent]
timeout_sec = 30.0

[verifier]
timeout_sec = 10.0
env = { EXPECTED_LINES = "3" }

[environment]
network_mode = "no-network"
cpus = 1
memory_mb = 512
storage_mb = 64
env = { DATA_FILE = "data.txt" }
"""


def harbor_task(
    root: Path, toml: str = HARBOR_TOML, test: str = 'test "$(cat count.txt)" = "$EXPECTED_LINES"\n'
) -> Path:
    task = root / "count-lines"
    (task / "environment" / "files").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "solution").mkdir()
    (task / "instruction.md").write_text("Write the number of lines of $DATA_FILE into count.txt.\n")
    (task / "task.toml").write_text(toml)
    (task / "environment" / "files" / "data.txt").write_text("a\nb\nc\n")
    (task / "tests" / "test.sh").write_text(test)
    (task / "solution" / "solve.sh").write_text('wc -l < "$DATA_FILE" > count.txt\n')
    return task


def test_harbors_keys_map_onto_the_sandbox(tmp_path: Path) -> None:
    task = load_task_dir(harbor_task(tmp_path))
    spec = task_sandbox_spec(task)
    assert spec.network is False and spec.limits.cpus == 1.0 and spec.limits.memory_mb == 512
    assert spec.limits.disk_mb == 64 and spec.env == {"DATA_FILE": "data.txt"}
    assert task.metadata["verify_env"] == {"EXPECTED_LINES": "3"} and task.metadata["difficulty"] == "easy"
    assert task.metadata["harbor"]["task"]["name"] == "acme/count-lines"
    assert task.metadata["agent_timeout_s"] == 30.0 and task.metadata["verify_timeout_s"] == 10.0


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
async def test_a_harbor_task_runs_in_a_real_sandbox_with_its_envs(tmp_path: Path) -> None:
    task = load_task_dir(harbor_task(tmp_path))
    sandbox = await BubblewrapBackend().create(task_sandbox_spec(task))
    try:
        assert not (await run_verifier(sandbox, task)).ok  # unsolved
        await sandbox.write_file("solve.sh", task.metadata["solution"])
        assert (await sandbox.exec("sh solve.sh")).ok  # DATA_FILE from [environment] env
        assert (await run_verifier(sandbox, task)).ok  # EXPECTED_LINES from [verifier] env
    finally:
        await sandbox.close()


def test_harbors_default_network_is_public_and_needs_consent(tmp_path: Path) -> None:
    toml = HARBOR_TOML.replace('network_mode = "no-network"\n', "")
    folder = harbor_task(tmp_path, toml)
    with pytest.raises(TaskDirError, match="Harbor's network_mode = 'public', its default"):
        load_task_dir(folder)
    assert task_sandbox_spec(load_task_dir(folder, allow_network=True)).network is True


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda t: (t / "environment" / "Dockerfile").write_text("FROM ubuntu\n"),
            "environment/Dockerfile: building the task's image",
        ),
        (lambda t: (t / "trajectory.json").write_text("{}"), "trajectory.json: a prior agent trajectory"),
        (lambda t: (t / "steps").mkdir(), "steps: multi-step tasks"),
        (lambda t: (t / "tests" / "test.bat").write_text("exit 0"), "tests/test.bat: Windows verifiers"),
        (
            lambda t: (t / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n"),
            "writes Harbor's reward file",
        ),
        (
            lambda t: (t / "tests" / "test.sh").write_text("python /tests/check.py\n"),
            "reads its files at /tests/",
        ),
    ],
)
def test_harbor_files_rllm_does_not_run_are_refused_by_name(tmp_path: Path, edit, message: str) -> None:
    folder = harbor_task(tmp_path)
    edit(folder)
    with pytest.raises(TaskDirError, match=message):
        load_task_dir(folder)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("[environment]\ngpus = 1\n", r"\[environment\] gpus: GPUs in the sandbox"),
        ('[environment]\nos = "windows"\n', "a non-Linux sandbox"),
        ('[environment]\nnetwork_mode = "allowlist"\n', "a network allowlist"),
        ('[environment]\nhealthcheck = { command = "true" }\n', "health check"),
        ('[verifier]\nuser = "root"\n', r"\[verifier\] user"),
        ('[[steps]]\nname = "one"\n', "multi-step tasks"),
        ("[environment]\nflux_capacitor = 1\n", "flux_capacitor: an unknown key"),
    ],
)
def test_harbor_keys_rllm_does_not_run_are_refused_by_name(tmp_path: Path, extra: str, message: str) -> None:
    section = extra.split("\n", 1)[0]
    body = extra.split("\n", 1)[1]
    toml = HARBOR_TOML.replace('network_mode = "no-network"\n', "") if "network_mode" in body else HARBOR_TOML
    if section.startswith("[[") or section.strip("[]") not in toml:
        toml = toml + "\n" + extra
    else:
        toml = toml.replace(section + "\n", section + "\n" + body, 1)
    with pytest.raises(TaskDirError, match=message):
        load_task_dir(harbor_task(tmp_path, toml), allow_network=True)
