"""Three ways to train a fresh tiny student on `say-single`, in one run: RL alone, SFT on a
teacher's good traces then RL, and on-policy distillation from the teacher.

Everything runs through the `rllm` commands a user types (subprocesses). Once per run, shared by
every seed (the teacher is not what is compared, so it is trained once and reused):
  0. chats: generated `say: WORD` -> `WORD` examples; `rllm sft` builds the tiny model from their
     words (its initial weights, WORKDIR/teacher-sft/tiny-model, are the fresh student every arm
     of every seed starts from: a seed changes the sampling and the SFT order) and fine-tunes it.
  1. teacher: `rllm train say-single --init-from` that SFT run, ``--teacher-steps`` steps; refused
     unless its last ``--window`` steps average >= ``--teacher-target`` (0.95); served by
     `rllm serve` for (b)'s eval and (c).
  2. (b)'s data, done once, but its wall seconds are charged to (b) in every seed. By default
     (``--traces train``) the teacher's own training run is the source: it keeps every group's
     samples (``sample_groups``) and `rllm dataset from-eval teacher --from-step S --min-reward 1.0`
     takes the good episodes of its last ``--window`` steps, the traces a user who trained the
     teacher already holds. ``--traces eval`` runs `rllm eval` with the served teacher (train
     split, 4 attempts) first, one command more (round 5's path).
Per seed, from the fresh student:
  (a) RL: `rllm train say-single`.
  (b) SFT then RL on the teacher's set: by default one command, `rllm train say-single --sft SET
      sft.KEY=VALUE ...` (SFT into b_sft_rl/sft, then RL from its final checkpoint in the same
      process: one start-up); ``--b-path two-commands`` runs `rllm sft`, then `rllm train
      --init-from` it (two start-ups, rounds 5-8's path; arm b2_sft_rl_two_commands); ``--b-path
      both`` runs both in every seed, alternating which goes first. (b)'s clock is the data step
      above + the SFT + the RL. SFT: ``--sft-epochs`` (30) epochs at ``--sft-lr`` (3e-3; the
      teacher's own SFT keeps ``--teacher-sft-lr`` 1e-3), 128-token batches.
  (c) distillation: `rllm distill say-single --teacher URL`, by default with the dense KL over the
      teacher's top-k per position (``--distill-loss topk``, ``--distill-topk``, ``--distill-kl``)
      and the settings the rllm-engine README recommends for it: one sample per task
      (``--distill-group-size 1``; the loss takes no group baseline) and 3x RL's learning rate
      (``--distill-lr 3e-3``; RL's ``--lr`` 1e-3 is (a)'s and (b)'s); ``--distill-set KEY=VALUE``
      adds overrides. ``--distill-loss sampled`` is the one-sample estimate of rounds 5-6, at RL's
      settings. The run prints each arm's settings first (``{"settings": ...}``).
Each arm's command is watched while it runs and stopped once its trailing ``--window``-step mean
reward reaches ``--target``; its wall time to the target is measured from the command's start (so
it includes the command's own start-up), and the start-up (the time to the first step, less that
step's own rollout and training time) is reported beside it, since on a loaded machine it is a
large part of a short run. Each seed's figures: WORKDIR/seedN/results.json. Target (issue #31): (b) and (c) each reach 0.9 in at most half of
(a)'s wall time.

    uv run --no-sync python benchmarks/distill_vs_rl.py --seeds 0 1 2
    uv run --no-sync python benchmarks/distill_vs_rl.py --seeds 0 --max-steps 3 --teacher-steps 2 --teacher-target 0   # smoke
    uv run --no-sync python benchmarks/distill_vs_rl.py --seeds 0 --arms c --distill-kl reverse   # one arm
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

WORDS = ["apple", "river", "stone", "cloud", "tiger", "lemon", "piano", "rocket"]
# No validation (the train reward is the measure) and no per-step extras: the arms time only
# what a user needs to get the policy there.
QUIET = ["progress=false", "plot=false", "tensorboard=false", "val_every=0", "rollout.workers=1"]
# A step's own seconds (a distillation step's teacher scoring is inside time/train_s).
STEP_TIMES = ("time/rollout_s", "time/train_s")
# The top-k loss's recommended settings (rllm-engine README, "distill.loss"; measured in
# benchmarks/history/issue-31.md, "Issue #31 round 8"): it takes no group baseline, so one sample
# per task; its dense, supervised-like target takes 3x RL's learning rate (RL at 3e-3 lost words).
TOPK_GROUP_SIZE = 1
TOPK_LR = 3e-3
DATA_CPU: list[float] = []
# (b)'s two paths, each its own arm: `rllm train --sft` (one process), and `rllm sft` then
# `rllm train --init-from` (two commands, two start-ups; rounds 5-8's path).
B_ARMS = {
    "one-command": "b_sft_rl",
    "two-commands": "b2_sft_rl_two_commands",
}  # CPU seconds of (b)'s data step's commands, done once per run


def command(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "rllm.cli.main", *args]


def rllm(
    args: list[str], cwd: Path, env: dict[str, str], out: str | None = None, cpu: list[float] | None = None
) -> float:
    """Run one `rllm` command to its end, writing a fresh ``cwd/out``; its wall seconds (a failure
    stops the benchmark). Its CPU seconds (its own and its reaped children's) go onto ``cpu``."""
    if out:
        shutil.rmtree(cwd / out, ignore_errors=True)
    started = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(command(args), cwd=cwd, env=env, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"`rllm {' '.join(args)}` failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    if cpu is not None:
        cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return time.perf_counter() - started


def step_records(run: Path) -> list[dict[str, Any]]:
    """The run's training steps so far (a line still being written is skipped)."""
    records = []
    try:
        lines = (run / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return []
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "reward/mean" in record:
            records.append(record)
    return records


def first_hit(values: list[float], window: int, target: float) -> int | None:
    for i in range(window - 1, len(values)):
        if statistics.fmean(values[i - window + 1 : i + 1]) >= target:
            return i + 1
    return None


def stop(proc: subprocess.Popen[bytes]) -> None:
    """End the command and its flow workers (it runs in its own process group)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def cpu_s(session: int | None = None, pid: int | None = None) -> float:
    """CPU seconds (user + system, reaped children included) of every live process in
    ``session`` (an arm's command runs in its own session: the command and its flow workers), or
    of the one process ``pid``. On a loaded machine an arm's CPU time is the figure the load
    does not inflate (wall time there is mostly waiting for a core)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or (pid is not None and int(entry.name) != pid):
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # it exited meanwhile
        if session is None or int(fields[3]) == session:
            total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return total / tick


def run_to_target(
    args: list[str],
    run: Path,
    cwd: Path,
    env: dict[str, str],
    opts: argparse.Namespace,
    teacher_pid: int | None = None,
    metric: str = "reward/mean",
) -> dict[str, Any]:
    """Run a training command until the trailing mean of ``metric`` reaches the target (then stop
    it) or it ends; the wall seconds to the target from the command's start, and where they went."""
    if run.exists():
        shutil.rmtree(run)
    load_before = os.getloadavg()[0]
    teacher_before = cpu_s(pid=teacher_pid) if teacher_pid else 0.0
    cpu = 0.0
    started = time.perf_counter()
    with open(cwd / f"{run.name}.log", "wb") as log:
        proc = subprocess.Popen(command(args), cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        first_seen: float | None = None
        hit: int | None = None
        try:
            while True:
                done = proc.poll() is not None
                records = step_records(run)
                if records and first_seen is None:
                    first_seen = time.perf_counter() - started
                hit = first_hit([r[metric] for r in records], opts.window, opts.target)
                cpu = max(cpu, cpu_s(session=proc.pid))  # the last reading before it is stopped
                if hit is not None or done:
                    break
                time.sleep(0.5)  # a benchmark's poll of the run's metrics file, not a test's wait
        finally:
            wall = time.perf_counter() - started
            stop(proc)
    if hit is None and proc.returncode not in (0, -signal.SIGTERM):
        raise SystemExit(f"`rllm {' '.join(args)}` failed (exit {proc.returncode}); see {cwd / run.name}.log")
    values = [float(r[metric]) for r in records]
    first_step = sum(float(records[0].get(k, 0.0)) for k in STEP_TIMES) if records else 0.0
    startup = (first_seen or wall) - first_step
    return {
        "steps_to_target": hit,
        "wall_to_target_s": wall if hit is not None else None,
        "startup_s": startup,
        "loop_to_target_s": wall - startup if hit is not None else None,
        "steps_run": len(values),
        "wall_s": wall,
        "rewards": [round(v, 3) for v in values],
        "load_avg_1m": [round(load_before, 1), round(os.getloadavg()[0], 1)],
        # CPU seconds of the command's processes (to the target, or to its end) and, for (c), of
        # the teacher's server over the arm.
        "cpu_s": round(cpu, 1),
        "teacher_cpu_s": round(cpu_s(pid=teacher_pid) - teacher_before, 1) if teacher_pid else None,
        "wall_per_step_s": round(wall / len(values), 2) if values else None,
    }


def serve(checkpoint: Path, env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    """`rllm serve` on the teacher's weights; returns the process and its /v1 URL once it listens."""
    proc = subprocess.Popen(
        command(["serve", str(checkpoint), "--port", "0"]),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:  # the server prints this line once it listens
        found = re.search(r"serving \S+ at (http://\S+/v1)", line)
        if found:
            # keep reading its output, so a full pipe never stalls the server
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            return proc, found.group(1)
    raise SystemExit(f"`rllm serve {checkpoint}` exited before it served (code {proc.wait()})")


def sft_args(epochs: int, lr: float, seed: int) -> list[str]:
    return [
        f"epochs={epochs}",
        "batch_tokens=128",
        f"backend.options.learning_rate={lr}",
        f"seed={seed}",
        "progress=false",
    ]


def rl_args(opts: argparse.Namespace, model: Path, seed: int) -> list[str]:
    return [
        f"backend.options.model={model}",
        f"backend.options.learning_rate={opts.lr}",
        f"total_steps={opts.max_steps}",
        f"seed={seed}",
        *QUIET,
    ]


def prepare_teacher(opts: argparse.Namespace, work: Path, env: dict[str, str]) -> dict[str, Any]:
    """The fresh model and the teacher (SFT, then ``--teacher-steps`` of RL; refused below
    ``--teacher-target``)."""
    chats = work / "chats.jsonl"
    rows = [
        {"messages": [{"role": "user", "content": f"say: {w}"}, {"role": "assistant", "content": w}]}
        for w in WORDS
    ]
    chats.write_text("".join(json.dumps(r) + "\n" for r in rows * 4))
    sft_wall = rllm(
        ["sft", str(chats), "--out", "teacher-sft", *sft_args(opts.teacher_sft_epochs, opts.teacher_sft_lr, 0)],
        work, env, "teacher-sft",
    )  # fmt: skip
    model = work / "teacher-sft" / "tiny-model"
    teacher_opts = argparse.Namespace(**{**vars(opts), "max_steps": opts.teacher_steps})
    # Every group's samples are kept (not the default 2 a step): (b)'s traces with --traces train.
    rl_wall = rllm(
        ["train", "say-single", "--out", "teacher", "--init-from", "teacher-sft", *rl_args(teacher_opts, model, 0),
         "sample_groups=64"],
        work, env, "teacher",
    )  # fmt: skip
    values = [float(r["reward/mean"]) for r in step_records(work / "teacher")]
    reward = statistics.fmean(values[-opts.window :])
    if reward < opts.teacher_target:
        raise SystemExit(
            f"the teacher's last {opts.window} steps average {reward:.3f} < {opts.teacher_target}"
        )
    return {"sft_wall_s": sft_wall, "rl_wall_s": rl_wall, "rewards": [round(v, 3) for v in values]}


def run_seed(
    seed: int,
    opts: argparse.Namespace,
    work: Path,
    env: dict[str, str],
    url: str,
    data_wall: float,
    teacher_pid: int | None = None,
) -> dict[str, Any]:
    out = work / f"seed{seed}"
    out.mkdir(exist_ok=True)
    model = work / "teacher-sft" / "tiny-model"  # the fresh student
    results: dict[str, Any] = {}
    if "a" in opts.arms:
        args = ["train", "say-single", "--out", "a_rl", *rl_args(opts, model, seed)]
        results["a_rl"] = run_to_target(args, out / "a_rl", out, env, opts)
        results["a_rl"]["command"] = "rllm " + " ".join(args)
    if "b" in opts.arms:
        paths = list(B_ARMS) if opts.b_path == "both" else [opts.b_path]
        for path in paths if seed % 2 == 0 else paths[::-1]:  # alternate the order of the two
            results[B_ARMS[path]] = run_b(opts, out, env, model, seed, data_wall, path)
    if "c" in opts.arms:
        args = ["distill", "say-single", "--teacher", url, "--reward-coef", str(opts.distill_reward_coef),
                "--out", "c_distill", *merged([*rl_args(opts, model, seed), *distill_args(opts)])]  # fmt: skip
        results["c_distill"] = run_to_target(args, out / "c_distill", out, env, opts, teacher_pid)
        results["c_distill"]["command"] = "rllm " + " ".join(args)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    return results


def distill_args(opts: argparse.Namespace) -> list[str]:
    """(c)'s loss and settings, after rl_args (later overrides win): the dense KL over the
    teacher's top-k (default) with the settings the rllm-engine README recommends for it (one
    sample per task, a higher learning rate than RL's), or the one-sample estimate with RL's."""
    topk = opts.distill_loss == "topk"
    # An explicit value is passed on as given (the config refuses a bad one, naming the key).
    group_size = (
        opts.distill_group_size
        if opts.distill_group_size is not None
        else (TOPK_GROUP_SIZE if topk else None)
    )
    lr = opts.distill_lr if opts.distill_lr is not None else (TOPK_LR if topk else None)
    loss = [f"distill.topk={opts.distill_topk}", f"distill.kl={opts.distill_kl}"] if topk else []
    return [
        f"distill.loss={opts.distill_loss}",
        *loss,
        *([f"group_size={group_size}"] if group_size is not None else []),
        *([f"backend.options.learning_rate={lr}"] if lr is not None else []),
        *opts.distill_set,
    ]


def merged(overrides: list[str]) -> list[str]:
    """``KEY=VALUE`` overrides as the config applies them: the last value of each key, in order."""
    last = {item.split("=", 1)[0]: item for item in overrides}
    return list(last.values())


def run_b(
    opts: argparse.Namespace,
    out: Path,
    env: dict[str, str],
    model: Path,
    seed: int,
    data_wall: float,
    path: str,
) -> dict[str, Any]:
    """(b) from the fresh student: by default one command, `rllm train --sft` (SFT into
    b_sft_rl/sft, then RL in the same process: one start-up); with ``--b-path two-commands``,
    `rllm sft` then `rllm train --init-from` (two start-ups)."""
    if path == "one-command":
        sft = [f"sft.{item}" for item in sft_args(opts.sft_epochs, opts.sft_lr, seed)]
        args = [
            "train",
            "say-single",
            "--out",
            "b_sft_rl",
            "--sft",
            "teacher-good",
            *rl_args(opts, model, seed),
            *sft,
        ]
        b = run_to_target(args, out / "b_sft_rl", out, env, opts)
        b["command"] = "rllm " + " ".join(args)
        sft_rows = [
            json.loads(line) for line in (out / "b_sft_rl" / "sft" / "metrics.jsonl").read_text().splitlines()
        ]
        # Inside the command's clock (and its start-up figure, which runs to RL's first step).
        b["sft_train_s"] = round(sum(float(r.get("time/train_s", 0.0)) for r in sft_rows), 2)
        b["sft_steps"] = len(sft_rows)
        b["prep_s"] = {"teacher_eval_and_from_eval": data_wall}
        b["prep_cpu_s"] = {"teacher_eval_and_from_eval": round(sum(DATA_CPU), 1)}
        sft_wall = 0.0
    else:
        sft_cpu: list[float] = []
        sft_wall = rllm(
            ["sft", "teacher-good", "--model", str(model), "--out", "b2_sft",
             *sft_args(opts.sft_epochs, opts.sft_lr, seed)],
            out, env, "b2_sft", sft_cpu,
        )  # fmt: skip
        args = [
            "train",
            "say-single",
            "--out",
            "b2_sft_rl",
            "--init-from",
            "b2_sft",
            *rl_args(opts, model, seed),
        ]
        b = run_to_target(args, out / "b2_sft_rl", out, env, opts)
        b["command"] = "rllm sft ... && rllm " + " ".join(args)
        b["prep_s"] = {"teacher_eval_and_from_eval": data_wall, "sft": sft_wall}
        b["prep_cpu_s"] = {"teacher_eval_and_from_eval": round(sum(DATA_CPU), 1), "sft": round(sft_cpu[0], 1)}
        b["cpu_s"] = round(b["cpu_s"] + sft_cpu[0], 1)  # both commands' CPU, as one-command's holds both
    b["b_path"] = path
    b["first_rewards"] = b["rewards"][:5]
    if b["wall_to_target_s"] is not None:
        b["wall_to_target_s"] += data_wall + sft_wall
        b["wall_to_target_without_teacher_eval_s"] = b["wall_to_target_s"] - data_wall
    return b


def ratio(table: dict[int, dict[str, Any]], arm: str, key: str, base: str = "wall_to_target_s") -> str:
    """Per seed, ``arm``'s ``key`` over (a)'s ``base``. Where (a) ran all its steps without reaching
    the target, its time to the target is more than its whole run: the ratio is an upper bound
    ("< x", over (a)'s ``wall_s``, or its loop with the start-up left out); "missed" where ``arm``
    did not reach it."""
    cells = []
    for seed, r in table.items():
        if arm not in r or "a_rl" not in r:
            continue
        a, value = r["a_rl"], r[arm].get(key)
        if value is None or r[arm]["steps_to_target"] is None:
            cells.append(f"seed {seed}: missed")
        elif a["steps_to_target"] is not None:
            cells.append(f"{value / a[base]:.2f}")
        else:  # (a)'s whole run (its CPU figure is already to its end)
            a_all = a["cpu_s"] if base == "cpu_s" else a["wall_s"]
            a_all -= a["startup_s"] if base == "loop_to_target_s" else 0.0
            cells.append(f"< {value / a_all:.2f}")
    return ", ".join(cells) or "n/a"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--max-steps", type=int, default=200, help="most RL / distillation steps per arm")
    parser.add_argument("--window", type=int, default=5)
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--teacher-steps", type=int, default=10)
    parser.add_argument("--teacher-target", type=float, default=0.95)
    parser.add_argument("--lr", type=float, default=1e-3, help="RL and distillation learning rate")
    # (b)'s SFT: 3e-3 for 30 epochs over the teacher's ~14 good traces starts RL at 0.97-0.98,
    # so RL needs only the 5-step window (1e-3: 0.71, 19 steps; 1e-2: unstable, 9-23 steps;
    # 60 epochs at 1e-3 also 5 steps, but twice the SFT steps): benchmarks/history/issue-31.md,
    # "Issue #31 (b) — SFT then RL in one command".
    parser.add_argument("--sft-lr", type=float, default=3e-3, help="(b)'s SFT learning rate")
    parser.add_argument("--teacher-sft-lr", type=float, default=1e-3, help="the teacher's SFT learning rate")
    parser.add_argument("--teacher-sft-epochs", type=int, default=30)
    parser.add_argument("--sft-epochs", type=int, default=30, help="(b)'s SFT epochs over the teacher's set")
    parser.add_argument(
        "--distill-reward-coef", type=float, default=0.0, help="(c): weight of the task reward's advantage"
    )
    parser.add_argument(
        "--distill-loss",
        choices=["topk", "sampled"],
        default="topk",
        help="(c)'s loss: a dense KL over the teacher's top-k per position, or the one-sample estimate",
    )
    parser.add_argument("--distill-topk", type=int, default=8, help="(c) with topk: the teacher's k")
    parser.add_argument("--distill-kl", choices=["forward", "reverse"], default="forward")
    parser.add_argument(
        "--distill-group-size",
        type=int,
        default=None,
        help=f"(c): samples per task (default: {TOPK_GROUP_SIZE} with topk, the cookbook's with sampled)",
    )
    parser.add_argument(
        "--distill-lr",
        type=float,
        default=None,
        help=f"(c): learning rate (default: {TOPK_LR} with topk, --lr with sampled)",
    )
    parser.add_argument(
        "--distill-set",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="(c): more config overrides, after the others (e.g. group_size=1)",
    )
    parser.add_argument(
        "--reuse-teacher", action="store_true", help="keep WORKDIR's teacher from an earlier run (not timed)"
    )
    parser.add_argument("--arms", nargs="+", choices=["a", "b", "c"], default=["a", "b", "c"])
    parser.add_argument(
        "--traces",
        choices=["train", "eval"],
        default="train",
        help="(b)'s SFT set: the teacher's training samples, or an `rllm eval` of the teacher",
    )
    parser.add_argument(
        "--b-path",
        choices=["one-command", "two-commands", "both"],
        default="one-command",
        help="(b): `rllm train --sft` (one process), `rllm sft` then `rllm train --init-from`, or both "
        "(each its own arm, b_sft_rl and b2_sft_rl, alternating in every seed)",
    )
    parser.add_argument("--workdir", default="/tmp/rllm-distill-vs-rl")
    opts = parser.parse_args()
    # A SIGTERM unwinds like Ctrl-C, so the running arm and the teacher's server are stopped too
    # (a background job started without job control ignores SIGINT).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(opts.workdir)
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "RLLM_HOME": str(work / "home")}
    # A user's install holds compiled bytecode (pip and `uv sync --compile-bytecode` write it; a
    # plain interpreter writes it on first import). With PYTHONDONTWRITEBYTECODE set, as on the
    # shared dev machine, every command compiled torch's and transformers' sources again at
    # start-up: 21 s of CPU against 9 s with bytecode to import the CLI, paid by every command of
    # every arm. The first command (the teacher's SFT, not timed) writes it for all the others.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if opts.reuse_teacher and (work / "teacher" / "checkpoints").is_dir():
        print(json.dumps({"teacher": f"reused {work / 'teacher'}"}), flush=True)  # (c)-only reruns
    else:
        print(json.dumps({"teacher": prepare_teacher(opts, work, env)}), flush=True)
    checkpoint = sorted((work / "teacher" / "checkpoints").glob("step_*"))[-1]
    proc, url = serve(checkpoint / "backend", env)
    try:
        source: list[str] = []
        if "b" not in opts.arms:
            data_wall = 0.0  # only (b) trains on the teacher's traces
        elif opts.traces == "eval":
            data_wall = rllm(
                ["eval", "say-single", "--base-url", url, "--split", "train", "--attempts", "4",
                 "--out", "b_eval", "--no-progress"],
                work, env, "b_eval", DATA_CPU,
            )  # fmt: skip
            source = ["b_eval"]
        else:
            data_wall = 0.0
            source = ["teacher", "--from-step", str(max(1, opts.teacher_steps - opts.window + 1))]
        if "b" in opts.arms:
            data_wall += rllm(
                ["dataset", "from-eval", *source, "--name", "teacher-good", "--min-reward", "1.0"],
                work,
                env,
                cpu=DATA_CPU,
            )
        # Each arm's settings (seed 0's; a later override of a key replaces an earlier one).
        base = rl_args(opts, work / "teacher-sft" / "tiny-model", 0)
        b_sft = sft_args(opts.sft_epochs, opts.sft_lr, 0)
        settings = {
            "a": base,
            "b_sft": b_sft,
            "b_path": opts.b_path,
            "c": merged([*base, *distill_args(opts)]),
        }
        print(json.dumps({"settings": settings}), flush=True)
        table = {}
        for seed in opts.seeds:
            table[seed] = run_seed(seed, opts, work, env, url, data_wall, proc.pid)
            print(json.dumps({seed: table[seed]}), flush=True)
    finally:
        proc.terminate()
        proc.wait()
    for seed, r in table.items():
        cells = [
            f"{arm}: {r[arm]['steps_to_target']} steps, "
            + (f"{r[arm]['wall_to_target_s']:.0f} s" if r[arm]["wall_to_target_s"] is not None else "missed")
            + f" (start-up {r[arm]['startup_s']:.0f} s, {r[arm]['cpu_s']:.0f} CPU s)"
            for arm in ("a_rl", *B_ARMS.values(), "c_distill")
            if arm in r
        ]
        print(f"seed {seed}: " + "; ".join(cells))
    for arm in (*B_ARMS.values(), "c_distill"):
        if not any(arm in r for r in table.values()):
            continue
        print(
            f"{arm} / a_rl wall time to {opts.target}: {ratio(table, arm, 'wall_to_target_s')} (target <= 0.5)"
        )
        print(
            f"  in the training loop only (start-ups left out): {ratio(table, arm, 'loop_to_target_s', 'loop_to_target_s')}"
        )
        print(f"  CPU seconds to {opts.target} over (a)'s: {ratio(table, arm, 'cpu_s', 'cpu_s')}")
    for path, arm in B_ARMS.items():
        if any(arm in r for r in table.values()):
            print(
                f"{arm} ({path}) without its data step (teacher eval / from-eval) / a_rl: "
                + ratio(table, arm, "wall_to_target_without_teacher_eval_s")
            )


if __name__ == "__main__":
    main()
