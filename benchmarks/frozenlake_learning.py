"""FrozenLake learning benchmark: the tiny model learns gymnasium's classic 4x4 map from scratch.

Training: `rllm train frozenlake-progress` on the `fixed` split (gymnasium's classic map, not
slippery, 8-turn limit): a tiny random Llama built for the cookbook, the local tinker backend on
CPU, the gateway in cumulative mode, GRPO over groups of rollouts of the one map, per-turn credit
(gamma 0.9). The reward is 1 at the goal and partial credit for the way covered (the progress
evaluator); success means reaching the goal.

Success rate per step = the fraction of that step's sampled episodes (temperature 1) that reach
the goal. Target: below 0.2 over the first 5 steps, 0.8 or more (mean of a 10-step window) within
10 minutes on 2 cores.

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


async def train(out: Path, minutes: float, group_size: int, lr: float) -> list[dict]:
    from rllm.engine.launch import build_trainer
    from rllm.engine.metrics_log import read_metrics

    trainer = build_trainer(
        "frozenlake-progress",
        out_dir=str(out),
        overrides=[
            "progress=false",
            "plot=false",
            "tensorboard=false",
            "train_split=fixed",
            "val_every=0",
            "total_steps=100000",
            "tasks_per_step=1",
            f"group_size={group_size}",
            "rollout.sampling.max_tokens=1",
            "rollout.sampling.temperature=1.0",
            f"backend.options.learning_rate={lr}",
            "algorithm.filter_zero_variance=false",
        ],
    )
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(trainer.fit(), minutes * 60)
    return read_metrics(out / "metrics.jsonl")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--group-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--out", default="")
    args = parser.parse_args()

    peer = random_policy_success()
    out = Path(args.out or tempfile.mkdtemp(prefix="frozenlake-bench-"))
    started = time.monotonic()
    rows = asyncio.run(train(out, args.minutes, args.group_size, args.lr))
    wall = time.monotonic() - started
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
    hit_s = None
    if hit is not None:
        hit_s = sum(float(r.get("time/rollout_s", 0)) + float(r.get("time/train_s", 0)) for r in rows[:hit])
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
        "seconds_to_target_approx": None if hit_s is None else round(hit_s, 1),
        "curve_per_10_steps": curve,
        "random_policy_success": round(peer, 4),
        "ratio_final_over_random": None if peer == 0 else round(final / peer, 1),
        "target_met": first < START_BELOW and hit is not None,
        "metrics": str(out / "metrics.jsonl"),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
