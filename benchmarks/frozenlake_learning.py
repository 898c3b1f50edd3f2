"""FrozenLake learning benchmark: the tiny model learns gymnasium's classic 4x4 map from scratch.

Training: `rllm train frozenlake-progress` on the `fixed` split (gymnasium's classic map, not
slippery, 8-turn limit): a tiny random Llama built for the cookbook, the local tinker backend on
CPU (full fine-tuning, learning rate 5e-4), the gateway in cumulative mode, flows in two worker
processes, GRPO over a group of 16 rollouts of the one map, one token per reply. Each turn's
prompt is the map's rows, the moves and the agent's cell (one word). The reward is the progress
evaluator's potential shaping (1 at the goal); each move is credited with its own change of
potential (`step_credit="turn"`, gamma 0).

Success rate per step = the fraction of that step's sampled episodes (temperature 1) that reach
the goal. Target: below 0.2 over the first 5 steps, 0.8 or more (mean of a 10-step window) within
10 minutes on 2 cores. Every `--val-every` steps one greedy episode (temperature 0) is played too:
`greedy_success_by_step`.

Peer, in the same run: a uniformly random policy over the four moves on the same map and turn
limit (gymnasium, 2000 episodes); the script prints the trained policy's success over it.

    uv run --no-sync python benchmarks/frozenlake_learning.py [--minutes 10] [--group-size 16]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import tempfile
import time
from pathlib import Path

WINDOW = 10
TARGET = 0.8
START_BELOW = 0.2


def random_policy_success(episodes: int = 2000, max_turns: int = 8, seed: int = 0) -> float:
    from rllm_cookbook_frozenlake import FIXED_MAP
    from rllm_cookbook_frozenlake.env import make_env

    env, rng, wins = make_env(FIXED_MAP), random.Random(seed), 0
    for _ in range(episodes):
        env.reset(seed=0)
        for _ in range(max_turns):
            _, reward, terminated, _, _ = env.step(rng.randrange(4))
            if terminated:
                wins += reward > 0
                break
    env.close()
    return wins / episodes


async def train(out: Path, minutes: float, args: argparse.Namespace, started: float) -> list[dict]:
    from rllm.engine.training.launch import build_trainer
    from rllm.engine.training.metrics_log import read_metrics

    trainer = build_trainer(
        args.cookbook,
        out_dir=str(out),
        overrides=[
            "progress=false",
            "plot=false",
            "tensorboard=false",
            f"seed={args.seed}",
            "train_split=fixed",
            "val_split=fixed",
            f"val_every={args.val_every}",
            "total_steps=100000",
            f"tasks_per_step={args.tasks_per_step}",
            f"group_size={args.group_size}",
            f"rollout.workers={args.workers}",
            "rollout.sampling.max_tokens=1",
            "rollout.val_sampling.max_tokens=1",
            f"rollout.sampling.temperature={args.temperature}",
            f"backend.options.learning_rate={args.lr}",
            f"algorithm.estimator={args.estimator}",
            f"algorithm.gamma={args.gamma}",
            f"algorithm.entropy_coef={args.entropy}",
            "algorithm.filter_zero_variance=false",
        ],
    )
    logged_at: list[float] = []  # wall seconds since the start when each metrics row appeared
    watcher = asyncio.create_task(watch_rows(out / "metrics.jsonl", started, logged_at))
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(trainer.fit(overwrite=True), minutes * 60)
    watcher.cancel()
    rows = read_metrics(out / "metrics.jsonl")
    for row, seconds in zip(rows, logged_at, strict=False):
        row["wall_s"] = seconds
    return rows


async def watch_rows(path: Path, started: float, logged_at: list[float]) -> None:
    """Note the wall time at which each new metrics row shows up (checked every 0.2 s)."""
    while True:
        if path.is_file():
            count = path.read_bytes().count(b"\n")
            logged_at.extend([time.monotonic() - started] * (count - len(logged_at)))
        await asyncio.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--cookbook", default="frozenlake-progress", help="frozenlake: goal-only reward")
    parser.add_argument("--group-size", type=int, default=16)
    parser.add_argument("--tasks-per-step", type=int, default=1, help="groups of the one map per step")
    parser.add_argument("--workers", type=int, default=2, help="flow processes")
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--estimator", default="grpo")
    parser.add_argument("--gamma", type=float, default=0.0)
    parser.add_argument("--entropy", type=float, default=0.0, help="entropy bonus coefficient")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--val-every", type=int, default=10, help="greedy episode on the map every N steps")
    parser.add_argument("--seed", type=int, default=0, help="the tiny model's initialisation and sampling")
    parser.add_argument("--out", default="")
    args = parser.parse_args()

    peer = random_policy_success()
    out = Path(args.out or tempfile.mkdtemp(prefix="frozenlake-bench-"))
    started = time.monotonic()
    logged = asyncio.run(train(out, args.minutes, args, started))
    wall = time.monotonic() - started
    rows = [row for row in logged if "reward/mean" in row]  # step 0's row is validation only
    greedy = [
        [int(row.get("step", 0)), float(row["val/correct/fraction"])]
        for row in logged
        if "val/correct/fraction" in row
    ]
    success = [float(row.get("correct/fraction", 0.0)) for row in rows]
    first = sum(success[:5]) / max(1, len(success[:5]))
    hit = next(
        (
            i + 1
            for i in range(WINDOW - 1, len(success))
            if sum(success[i - WINDOW + 1 : i + 1]) / WINDOW >= TARGET
        ),
        None,
    )
    hit_s = None if hit is None else rows[hit - 1].get("wall_s")
    final = sum(success[-WINDOW:]) / max(1, len(success[-WINDOW:]))
    curve = [
        round(sum(success[i : i + WINDOW]) / len(success[i : i + WINDOW]), 3)
        for i in range(0, len(success), WINDOW)
    ]
    report = {
        "steps": len(rows),
        "wall_s": round(wall, 1),
        "success_first_5_steps": round(first, 3),
        "success_last_window": round(final, 3),
        "step_reaching_target": hit,
        "wall_s_to_target": None if hit_s is None else round(hit_s, 1),
        "curve_per_10_steps": curve,
        "greedy_success_by_step": greedy,
        "random_policy_success": round(peer, 4),
        "ratio_final_over_random": None if peer == 0 else round(final / peer, 1),
        "target_met": first < START_BELOW and hit is not None,
        "metrics": str(out / "metrics.jsonl"),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
