"""Ctrl-C in a terminal: `rllm train say` as a real subprocess gets SIGINT (to its whole process
group, as a terminal sends it) in the middle of a run. It exits 130 with one line on stderr and
no traceback, leaves no process behind (rollout workers included), and the run folder resumes.

The test waits on the run's own metrics file (step 2 logged), never on a fixed sleep.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rllm.engine.metrics_log import read_metrics

pytestmark = pytest.mark.slow

# ckpt_every=0: only the checkpoint Ctrl-C saves (and the one at the end) can be resumed from.
ARGS = ["progress=false", "plot=false", "tensorboard=false", "val_every=0", "ckpt_every=0"]
ARGS += ["tasks_per_step=4", "group_size=4", "rollout.workers=2"]


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "rllm.cli.main", *args]


def _stat(pid: int) -> tuple[int, int, str] | None:
    """(parent pid, process group, state) of a live pid, None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return int(fields[1]), int(fields[2]), fields[0]


def _descendants(root: int) -> set[int]:
    stats = {
        int(p.name): s for p in Path("/proc").iterdir() if p.name.isdigit() and (s := _stat(int(p.name)))
    }
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, (parent, _, _) in stats.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pids: set[int], group: int) -> set[int]:
    """Of ``pids`` and the members of ``group``, those still running (zombies have exited)."""
    members = {int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()}
    out = set()
    for pid in pids | members:
        stat = _stat(pid)
        if stat is not None and stat[2] != "Z" and (pid in pids or stat[1] == group):
            out.add(pid)
    return out


def _ctrl_c_at_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_exits_130_with_one_line_and_the_run_resumes(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["train", "say", "--out", str(out), "total_steps=100", *ARGS]
    stderr_path = tmp_path / "stderr.txt"
    with stderr_path.open("w") as stderr:
        # As a terminal starts a foreground command: Ctrl-C at its default. A test run launched in
        # the background of a shell inherits SIGINT ignored, and Python then never raises
        # KeyboardInterrupt (the run would carry on to its end).
        proc = subprocess.Popen(
            _cli(*args),
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
            preexec_fn=_ctrl_c_at_default,
        )
    try:
        deadline = time.monotonic() + 300
        metrics = out / "metrics.jsonl"
        while not (metrics.is_file() and len(read_metrics(metrics)) >= 2):
            assert proc.poll() is None, stderr_path.read_text()
            assert time.monotonic() < deadline, "step 2 was not logged within 300 s"
            time.sleep(0.05)
        workers = _descendants(proc.pid)
        assert workers, "the run started no rollout worker process"
        before = len(stderr_path.read_text())
        os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C reaches the whole foreground group
        assert proc.wait(timeout=120) == 130
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = stderr_path.read_text()
    assert "Traceback" not in text, text
    after = [line for line in text[before:].splitlines() if line.strip()]
    assert after == [after[0]] and after[0].startswith("interrupted"), text[before:]
    # Workers exit with the run; a process still running now was left behind.
    deadline = time.monotonic() + 10
    while (left := _alive(workers, proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"processes left behind: {sorted(left)}"

    steps = [row["step"] for row in read_metrics(out / "metrics.jsonl")]
    assert after[0].startswith(f"interrupted: saving a checkpoint of step {steps[-1]}"), after
    # The folder resumes (one worker: what is checked here is the folder, not the workers' start).
    resume = ["--resume", f"total_steps={steps[-1] + 1}", *ARGS, "rollout.workers=1"]
    resumed = subprocess.run(
        _cli("train", "say", "--out", str(out), *resume),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert [row["step"] for row in read_metrics(out / "metrics.jsonl")] == [*steps, steps[-1] + 1]
