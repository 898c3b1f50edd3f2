"""Ctrl-C in a terminal: `rllm train say` as a real subprocess gets SIGINT (to its whole process
group, as a terminal sends it) between two steps of a run. It exits 130 with one line on stderr
and no traceback, saves a checkpoint of the last step, leaves no process behind (rollout workers
included), and the run folder resumes.

Only between steps is a checkpoint truthful (the Trainer saves none mid-update), so the test
must not race the run to that window: the agent is the say cookbook's flow, except that once two
steps are logged every rollout waits until cancelled, and the first to wait says so on stderr.
The run then stays between steps 2 and 3 for as long as it takes, and the test sends Ctrl-C
when it reads that line (its pipe is the event; no sleep, however busy the machine).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from rllm.cli.main import cli
from rllm.engine.training.checkpoint import checkpoint_dir
from rllm.engine.training.metrics_log import read_metrics
from rllm.testing import read_until_line

pytestmark = pytest.mark.slow

# ckpt_every=0: only the checkpoint Ctrl-C saves (and the one at the end) can be resumed from.
ARGS = ["progress=false", "plot=false", "tensorboard=false", "val_every=0", "ckpt_every=0"]
ARGS += ["tasks_per_step=4", "group_size=4", "rollout.workers=2"]


# The say flow, held once RLLM_TEST_HOLD_AFTER ("METRICS_PATH:STEPS") steps are logged. Steps run
# one after the other (no prefetch): a rollout that starts after step 2's row belongs to step 3.
HELD_FLOW = """
import asyncio
import os
import sys
from pathlib import Path

from rllm.engine.training.metrics_log import read_metrics
from rllm.sdk import rollout
from rllm_cookbook_say import say_flow


@rollout
async def say_held_after_steps(task, config):
    hold = os.environ.get("RLLM_TEST_HOLD_AFTER")
    if hold:
        metrics, steps = hold.rsplit(":", 1)
        if len(read_metrics(Path(metrics))) >= int(steps):
            try:  # one line, from the first rollout held (O_EXCL: whichever worker runs it)
                os.close(os.open(metrics + ".held", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                print("held: the next step's rollouts wait", file=sys.stderr, flush=True)
            except FileExistsError:
                pass
            await asyncio.Event().wait()  # until Ctrl-C cancels the step
    return await say_flow(task, config)
"""
AGENT = "rllm_say_held:say_held_after_steps"


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
    (tmp_path / "rllm_say_held.py").write_text(textwrap.dedent(HELD_FLOW))
    # The rollout workers are spawned: they find the flow's module on PYTHONPATH too.
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    out = tmp_path / "run"
    metrics = out / "metrics.jsonl"
    args = ["train", "say", "--agent", AGENT, "--out", str(out), "total_steps=100", *ARGS]
    # As a terminal starts a foreground command: Ctrl-C at its default. A test run launched in
    # the background of a shell inherits SIGINT ignored, and Python then never raises
    # KeyboardInterrupt (the run would carry on to its end).
    proc = subprocess.Popen(
        _cli(*args),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=_ctrl_c_at_default,
        env={**os.environ, "PYTHONPATH": path, "RLLM_TEST_HOLD_AFTER": f"{metrics}:2"},
    )
    try:
        before = read_until_line(proc, "held:", 600, "step 3's rollouts held after step 2")
        assert len(read_metrics(metrics)) == 2  # and step 3 cannot end: between steps 2 and 3
        workers = _descendants(proc.pid)
        assert workers, "the run started no rollout worker process"
        os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C reaches the whole foreground group
        _, rest = proc.communicate(timeout=120)
        assert proc.returncode == 130, rest
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = rest.decode(errors="replace")
    assert "Traceback" not in "\n".join(before) + text, text
    after = [line for line in text.splitlines() if line.strip()]
    assert after == [after[0]] and after[0].startswith("interrupted"), text
    # Workers exit with the run; a process still running now was left behind.
    deadline = time.monotonic() + 10
    while (left := _alive(workers, proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"processes left behind: {sorted(left)}"

    steps = [row["step"] for row in read_metrics(metrics)]
    assert steps == [1, 2]
    assert after[0].startswith("interrupted: saving a checkpoint of step 2"), after
    # The folder resumes (one worker: what is checked here is the folder, not the workers' start),
    # with the same agent, not held this time.
    resume = ["--resume", "--allow-changes", "total_steps,rollout.workers", "--agent", AGENT, "total_steps=3"]
    resume += [*ARGS, "rollout.workers=1"]
    resumed = subprocess.run(
        _cli("train", "say", "--out", str(out), *resume),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "PYTHONPATH": path},
    )
    assert resumed.returncode == 0, resumed.stderr
    assert [row["step"] for row in read_metrics(metrics)] == [1, 2, 3]


def test_ctrl_c_twice_exits_130_without_a_traceback_and_leaves_a_consistent_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C, and Ctrl-C again as soon as the run says it is saving (the second may land in the
    save or after it, as a user's does): exit 130, no traceback, and the folder is whole: it
    resumes from the checkpoint the first Ctrl-C saved, or (the save skipped) `--resume` says in
    one line that there is no checkpoint. Resumed with total_steps=1, the run needs no start-up
    either way: it is finished, or refused."""
    (tmp_path / "rllm_say_held.py").write_text(textwrap.dedent(HELD_FLOW))
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    out = tmp_path / "run"
    metrics = out / "metrics.jsonl"
    quick = [*ARGS, "tasks_per_step=2", "group_size=2", "rollout.workers=1"]
    args = ["train", "say", "--agent", AGENT, "--out", str(out), "total_steps=100", *quick]
    proc = subprocess.Popen(
        _cli(*args),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=_ctrl_c_at_default,
        env={**os.environ, "PYTHONPATH": path, "RLLM_TEST_HOLD_AFTER": f"{metrics}:1"},
    )
    try:
        lines = read_until_line(proc, "held:", 600, "step 2's rollouts held after step 1")
        os.killpg(proc.pid, signal.SIGINT)
        lines += read_until_line(proc, "interrupted", 120, "the run's line saying it stops")
        assert lines[-1].startswith("interrupted: saving a checkpoint of step 1"), lines
        try:
            os.killpg(proc.pid, signal.SIGINT)  # the second, at once
        except ProcessLookupError:  # the save and the exit were quicker than this test
            pass
        _, rest = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = "\n".join(lines) + rest.decode(errors="replace")
    assert proc.returncode == 130, text
    assert "Traceback" not in text and "Exception ignored" not in text, text
    after = [line for line in rest.decode(errors="replace").splitlines() if line.strip()]
    assert all(line.startswith("interrupted") for line in after), after  # at most its own line
    assert [row["step"] for row in read_metrics(metrics)] == [1]

    # In-process (the folder is refused or found finished before anything is built): the
    # agent's module is importable here too.
    monkeypatch.syspath_prepend(str(tmp_path))
    resume = ["--resume", "--allow-changes", "total_steps", "--agent", AGENT, "total_steps=1", *quick]
    resumed = CliRunner().invoke(cli, ["train", "say", "--out", str(out), *resume], catch_exceptions=False)
    said = [line for line in resumed.stderr.splitlines() if line.strip()]
    if (checkpoint_dir(out, 1) / "trainer_state.json").is_file():
        assert resumed.exit_code == 0 and len(said) == 1 and "nothing to resume" in said[0], said
    else:
        assert resumed.exit_code == 2 and len(said) == 1 and "no complete checkpoint" in said[0], said
