"""Asynchronous (rollout.max_staleness = K) against synchronous training, in one run.

Agent rollouts are dominated by tool latency, so each turn of the say game first waits for a
simulated tool call: lognormal, median 50 ms, p99 about 1 s (``asyncio.sleep``: the CPU is free
meanwhile). The tiny model trains on the local tinker backend; sync (K = 0), K = 1 and K = 4
(with the default correction, algorithm.tis = "token") run the same number of steps, one after
another, for each seed. Printed per run: wall time, wall time to a mean reward of ``--target``
(over the last 5 steps; "-" if not reached), final reward (mean of the last 5 steps), trainer
and rollout utilisation (async rows), and the ratio of each K's wall time to sync's.

    uv run python benchmarks/async_vs_sync.py --steps 40 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import math
import random
import statistics
import tempfile
import time
from pathlib import Path

from openai.types.chat import ChatCompletionMessageParam

from rllm.engine.launch import build_trainer
from rllm.engine.metrics_log import read_metrics
from rllm.engine.trainer import Trainer
from rllm.sdk import rollout, sampling_kwargs
from rllm.sdk.clients import async_openai
from rllm.types import AgentConfig, Task

MEDIAN_S = 0.05
SIGMA = math.log(1.0 / MEDIAN_S) / 2.326  # p99 = median * exp(2.326 sigma) = 1 s


@rollout
async def slow_tool_say(task: Task, config: AgentConfig) -> dict:
    """The say game, each turn behind a heavy-tailed tool call."""
    messages: list[ChatCompletionMessageParam] = []
    replies = []
    async with async_openai(config) as client:
        for word in task.metadata["words"]:
            await asyncio.sleep(random.lognormvariate(math.log(MEDIAN_S), SIGMA))
            messages.append({"role": "user", "content": f"say: {word}"})
            reply = await client.chat.completions.create(
                model=config.model, messages=messages, **{"max_tokens": 4, **sampling_kwargs(config)}
            )
            text = reply.choices[0].message.content or ""
            messages.append({"role": "assistant", "content": text})
            replies.append(text)
    return {"replies": replies}


@dataclasses.dataclass
class Run:
    wall_s: float
    to_target_s: str
    final_reward: float
    trainer_util: float
    rollout_util: float
    stale_max: float


def run(k: int, seed: int, steps: int, out: Path, target: float) -> Run:
    overrides = [
        "progress=false",
        "plot=false",
        "tensorboard=false",
        "val_every=0",
        "sample_groups=0",
        "rollout.workers=1",
        f"seed={seed}",
        f"total_steps={steps}",
        f"rollout.max_staleness={k}",
    ]
    built = build_trainer("say-single", out_dir=str(out), overrides=overrides)
    cookbook = dataclasses.replace(built.cookbook, flow=slow_tool_say)
    trainer = Trainer(built.config, cookbook, built.backend)
    started = time.perf_counter()
    asyncio.run(trainer.fit())
    wall = time.perf_counter() - started
    rows = read_metrics(out / "metrics.jsonl")
    rewards = [r["reward/mean"] for r in rows]
    elapsed, reached = 0.0, "-"
    for i, row in enumerate(rows):
        elapsed += row["time/rollout_s"] + row["time/train_s"]
        if i >= 4 and statistics.fmean(rewards[i - 4 : i + 1]) >= target:
            reached = f"{elapsed:.1f}"
            break
    util = [r["async/trainer_utilisation"] for r in rows if "async/trainer_utilisation" in r]
    rutil = [r["async/rollout_utilisation"] for r in rows if "async/rollout_utilisation" in r]
    return Run(
        wall_s=wall,
        to_target_s=reached,
        final_reward=statistics.fmean(rewards[-5:]),
        trainer_util=statistics.fmean(util) if util else float("nan"),
        rollout_util=statistics.fmean(rutil) if rutil else float("nan"),
        stale_max=max((r.get("async/staleness_max", 0) for r in rows), default=0),
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--ks", type=int, nargs="+", default=[0, 1, 4])
    parser.add_argument("--target", type=float, default=0.9)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print("seed  K  wall_s  to_target_s  final_reward  trainer_util  rollout_util  stale_max  wall/sync")
        for seed in args.seeds:
            sync_wall: float | None = None
            for k in args.ks:
                r = run(k, seed, args.steps, Path(tmp) / f"s{seed}k{k}", args.target)
                sync_wall = r.wall_s if k == 0 else sync_wall
                ratio = f"{r.wall_s / sync_wall:.2f}" if sync_wall else "-"
                print(
                    f"{seed:>4} {k:>2} {r.wall_s:>7.1f} {r.to_target_s:>12} {r.final_reward:>13.3f}"
                    f" {r.trainer_util:>13.2f} {r.rollout_util:>13.2f} {r.stale_max:>10} {ratio:>10}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
