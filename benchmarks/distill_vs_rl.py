"""Three ways to train a fresh tiny student on `say-single`, in one run: RL alone, SFT on a
teacher's good traces then RL, and on-policy distillation from the teacher.

Per seed, everything through the `rllm` commands a user types (subprocesses, 2 torch threads):
  0. chats: generated `say: WORD` -> `WORD` examples; `rllm sft` builds the tiny model from their
     words (its initial weights are the student every arm starts from) and fine-tunes it.
  1. teacher: `rllm train say-single --init-from` that SFT run, ``--teacher-steps`` steps; served
     by the local sampler (`rllm serve CHECKPOINT/backend`).
  (a) RL: `rllm train say-single` from the fresh model, ``--steps`` steps.
  (b) SFT then RL: `rllm eval` with the teacher (train split, 4 attempts) -> `rllm dataset
      from-eval --min-reward 1.0` -> `rllm sft` on it from the fresh model -> `rllm train
      --init-from`; its clock includes the eval and the SFT.
  (c) distillation: `rllm distill say-single --teacher URL` from the fresh model.
For each arm: the first step whose trailing ``--window``-step mean reward reaches ``--target``,
the arm's wall seconds to it (each step's share of the run's wall time, plus (b)'s preparation),
and mean reward per wall second. Target (issue #31): (b) and (c) each reach 0.9 in at most half
of (a)'s wall time.

    uv run --no-sync python benchmarks/distill_vs_rl.py --seeds 0 1 2
    uv run --no-sync python benchmarks/distill_vs_rl.py --seeds 0 --steps 2 --teacher-steps 2   # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from rllm.engine.metrics_log import read_metrics

WORDS = ["apple", "river", "stone", "cloud", "tiger", "lemon", "piano", "rocket"]
QUIET = ["progress=false", "plot=false", "tensorboard=false", "rollout.workers=1"]


def rllm(args: list[str], cwd: Path, env: dict[str, str]) -> float:
    """Run one `rllm` command; its wall seconds (a failure stops the benchmark with its output)."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "rllm.cli.main", *args], cwd=cwd, env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"`rllm {' '.join(args)}` failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return time.perf_counter() - started


def rewards(run: Path) -> list[float]:
    return [float(r["reward/mean"]) for r in read_metrics(run / "metrics.jsonl") if "reward/mean" in r]


def first_hit(values: list[float], window: int, target: float) -> int | None:
    for i in range(window - 1, len(values)):
        if statistics.fmean(values[i - window + 1 : i + 1]) >= target:
            return i + 1
    return None


def serve(checkpoint: Path, env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    """`rllm serve` on the teacher's weights; returns the process and its /v1 URL once it listens."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "rllm.cli.main", "serve", str(checkpoint)],
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


def run_seed(seed: int, args: argparse.Namespace) -> dict[str, dict[str, float | int | None]]:
    work = Path(args.workdir) / f"seed{seed}"
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "RLLM_HOME": str(work / "home")}
    chats = work / "chats.jsonl"
    rows = [
        {"messages": [{"role": "user", "content": f"say: {w}"}, {"role": "assistant", "content": w}]}
        for w in WORDS
    ]
    chats.write_text("".join(json.dumps(r) + "\n" for r in rows * 4))
    sft_args = [
        "epochs=8",
        "batch_tokens=128",
        "backend.options.learning_rate=0.001",
        f"seed={seed}",
        "progress=false",
    ]
    rllm(["sft", str(chats), "--out", "teacher-sft", *sft_args], work, env)
    model = work / "teacher-sft" / "tiny-model"  # fresh weights: every arm's student starts here
    student = [f"backend.options.model={model}", f"seed={seed}", *QUIET]
    rllm(
        [
            "train",
            "say-single",
            "--out",
            "teacher",
            "--init-from",
            "teacher-sft",
            f"total_steps={args.teacher_steps}",
            *student,
        ],
        work,
        env,
    )
    teacher_reward = statistics.fmean(rewards(work / "teacher")[-args.window :])
    proc, url = serve(sorted((work / "teacher" / "checkpoints").glob("step_*"))[-1] / "backend", env)
    results: dict[str, dict[str, float | int | None]] = {}
    try:
        steps = [f"total_steps={args.steps}"]
        walls = {"a_rl": rllm(["train", "say-single", "--out", "a_rl", *steps, *student], work, env)}
        prep = rllm(
            [
                "eval",
                "say-single",
                "--base-url",
                url,
                "--split",
                "train",
                "--attempts",
                "4",
                "--out",
                "b_eval",
                "--no-progress",
            ],
            work,
            env,
        )
        prep += rllm(
            ["dataset", "from-eval", "b_eval", "--name", "teacher-good", "--min-reward", "1.0"], work, env
        )
        prep += rllm(["sft", "teacher-good", "--model", str(model), "--out", "b_sft", *sft_args], work, env)
        walls["b_sft_rl"] = prep + rllm(
            ["train", "say-single", "--out", "b_sft_rl", "--init-from", "b_sft", *steps, *student], work, env
        )
        walls["c_distill"] = rllm(
            ["distill", "say-single", "--teacher", url, "--out", "c_distill", *steps, *student], work, env
        )
    finally:
        proc.terminate()
        proc.wait()
    for arm, wall in walls.items():
        values = rewards(work / arm)
        pre = prep if arm == "b_sft_rl" else 0.0
        hit = first_hit(values, args.window, args.target)
        per_step = (wall - pre) / max(len(values), 1)
        results[arm] = {
            "steps_to_target": hit,
            "wall_to_target_s": None if hit is None else pre + hit * per_step,
            "wall_s": wall,
            "final_reward": statistics.fmean(values[-args.window :]),
            "reward_per_wall_s": sum(values) / wall,
        }
    results["teacher"] = {"final_reward": teacher_reward}
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=60, help="RL / distillation steps per arm")
    parser.add_argument("--teacher-steps", type=int, default=60)
    parser.add_argument("--window", type=int, default=5)
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--workdir", default="/tmp/rllm-distill-vs-rl")
    args = parser.parse_args()
    table = {seed: run_seed(seed, args) for seed in args.seeds}
    print(json.dumps(table, indent=2))
    for arm in ("b_sft_rl", "c_distill"):
        ratios = [
            float(r[arm]["wall_to_target_s"]) / float(r["a_rl"]["wall_to_target_s"])  # pyright: ignore[reportArgumentType]
            for r in table.values()
            if r[arm]["wall_to_target_s"] is not None and r["a_rl"]["wall_to_target_s"] is not None
        ]
        shown = ", ".join(f"{x:.2f}" for x in ratios) or "n/a (an arm missed the target)"
        print(f"{arm} / a_rl wall time to {args.target}: {shown} (target <= 0.5)")


if __name__ == "__main__":
    main()
