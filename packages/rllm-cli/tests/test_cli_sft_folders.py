"""`rllm sft` under the run-folder contract, on the tiny model and the local Tinker service: a
second run into a folder is refused, --overwrite replaces it whole, --resume takes only the
recorded settings (or the keys --allow-changes names), and Ctrl-C (SIGINT to a real `rllm sft`
process) checkpoints the step it finishes so that --resume goes on from it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rllm.cli.main import main
from rllm.engine.training.checkpoint import latest_checkpoint, load_trainer_state
from rllm.engine.training.metrics_log import read_metrics

pytestmark = pytest.mark.slow

FAST = ["progress=false", "tensorboard=false", "batch_tokens=20", "backend.options.learning_rate=0.01"]
FRUITS = ["apple", "banana", "cherry", "grape", "lemon", "mango"]


def write_chats(path: Path, n: int = 12) -> Path:
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"say {FRUITS[i % len(FRUITS)]}"},
                {"role": "assistant", "content": FRUITS[i % len(FRUITS)]},
            ]
        }
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_sft_refuses_a_second_run_overwrites_whole_and_resumes_only_as_recorded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chats = write_chats(tmp_path / "chats.jsonl")
    out = tmp_path / "run"
    args = ["sft", str(chats), "--out", str(out), *FAST]
    assert main([*args, "total_steps=2", "ckpt_every=1", "progress=true"]) == 0
    checkpoint = latest_checkpoint(out)
    assert checkpoint is not None and checkpoint.name == "step_000002"
    saved = (checkpoint / "trainer_state.json").read_bytes()
    # Its progress shows the loss it trains down (it used to say "reward 0.000" at every step).
    progress = [line for line in capsys.readouterr().err.splitlines() if line.startswith("step ")]
    assert [line.split()[:3] for line in progress] == [["step", "1/2", "loss"], ["step", "2/2", "loss"]]

    # The same command again: refused, the checkpoint untouched.
    assert main([*args, "total_steps=2", "ckpt_every=1"]) == 2
    assert "already holds a supervised fine-tuning run" in capsys.readouterr().err
    assert (checkpoint / "trainer_state.json").read_bytes() == saved

    # --resume with another total: refused until asked for, then it goes on from step 2.
    assert main([*args, "total_steps=3", "ckpt_every=1", "--resume"]) == 2
    err = capsys.readouterr().err
    assert "total_steps (run: 2, now: 3)" in err and "--allow-changes total_steps" in err
    assert main([*args, "total_steps=3", "ckpt_every=1", "--resume", "--allow-changes", "total_steps"]) == 0
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2, 3]

    # --resume of the finished run: nothing to do, said (exit 0), nothing started or written.
    capsys.readouterr()
    record = (out / "rllm-run.json").read_bytes()
    assert main([*args, "total_steps=3", "ckpt_every=1", "--resume"]) == 0
    err = capsys.readouterr().err
    assert "finished at step 3 (3 steps planned): nothing to resume" in err, err
    assert "done" not in err and (out / "rllm-run.json").read_bytes() == record
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2, 3]

    # --overwrite: a run of one step, and nothing of the earlier one left (no step 2 or 3 checkpoint).
    assert main([*args, "total_steps=1", "--overwrite"]) == 0
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_000001"]


def test_ctrl_c_checkpoints_the_step_it_finishes_and_resume_goes_on_from_it(tmp_path: Path) -> None:
    chats = write_chats(tmp_path / "chats.jsonl", n=24)
    out = tmp_path / "run"
    # Steps enough that the run is still going when the signal lands, however fast the machine;
    # ckpt_every=0: only the checkpoint Ctrl-C saves can be resumed from.
    args = ["sft", str(chats), "--out", str(out), *FAST, "epochs=2000", "ckpt_every=0"]
    cli = [sys.executable, "-m", "rllm.cli.main"]
    # A shell starts a command with Ctrl-C at its default; a test process may have it ignored (a
    # child inherits that, and asyncio.run then installs no handler): as test_cli_interrupt.py does.
    proc = subprocess.Popen(
        [*cli, *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    metrics = out / "metrics.jsonl"
    try:
        deadline = time.monotonic() + 600
        # The metrics file is the event: two steps done (polled: a file offers nothing to wait on).
        while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 2):
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "no second step within 600 s"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C reaches the whole group
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = err.decode(errors="replace")
    assert proc.returncode == 130, text
    assert "Traceback" not in text, text
    assert "interrupted: finishing step" in text and "Ctrl-C again to skip" in text
    checkpoint = latest_checkpoint(out)
    assert checkpoint is not None, text
    done = load_trainer_state(checkpoint).step
    assert done >= 2 and [r["step"] for r in read_metrics(metrics)] == list(range(1, done + 1))
    assert f"checkpoint of step {done} saved" in text

    # --resume (the same settings, a total now in reach) goes on from that step, not from 0.
    total = f"total_steps={done + 1}"
    resumed = subprocess.run(
        [*cli, *args, total, "--resume", "--allow-changes", "total_steps"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert [r["step"] for r in read_metrics(metrics)] == list(range(1, done + 2))
