"""Two policies vs one (#53), local tinker service, tiny model, CPU.

``--part cost`` (default): per-step cost of two policies vs one on the same rollouts; the peer is
one policy, measured in the same run, steps alternating. Target: ≤ 1.3×. One policy: train_step
on the whole batch + sync_weights. Two policies: the batch's first half trains the default
adapter, the second half the judge's (train_policy_step each) + sync_weights (every adapter).
The median ratio is printed.

``--part curves``: the solver-judge cookbook's learning curves, one policy shared by every role
vs two separate policies (the judge on its own adapter: configs/two_policies.yaml's mapping),
same seed, tasks and steps; each step's reward (the judge's: the episode's) and each role's
trajectory reward, then the final reward (the mean of the last ``--tail`` steps) of each. A
short run on a random tiny model: it shows both setups train end to end on the same rollout
budget, not which one learns the task better on a real model (a random word-level model never
writes a ``\\boxed{}`` answer, so solver-judge's rewards stay 0 there). ``--cookbook
guess-number`` draws the same curves for the self-play game (the guesser on its own adapter),
whose rewards a tiny model does earn.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path

from rllm.algos.config import AlgorithmConfig
from rllm.backends.tinker import TinkerBackend
from rllm.engine.training.launch import build_trainer
from rllm.engine.training.metrics_log import read_episode_sample, read_metrics, sample_path
from rllm.engine.training.policies import PolicySection
from rllm.tiny import init_tiny_model
from rllm.types import FloatArray, TokenArray, TrainSequence


def batch(n: int, length: int, vocab: int, seed: int) -> list[TrainSequence]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        prompt = length // 2
        ids = [rng.randrange(3, vocab) for _ in range(length)]
        out.append(
            TrainSequence(
                input_ids=TokenArray(ids),
                loss_mask=FloatArray([0.0] * prompt + [1.0] * (length - prompt)),
                advantages=FloatArray([rng.choice([-1.0, 1.0])] * length),
                sampler_logprobs=FloatArray([0.0] * length),
            )
        )
    return out


async def cost(args: argparse.Namespace) -> None:
    algo = AlgorithmConfig(loss="ppo_clip")
    with tempfile.TemporaryDirectory() as tmp:
        model = init_tiny_model(Path(tmp) / "m", seed=0)
        options = {"model": str(model), "dtype": "float32", "torch_threads": 2, "lora": {"rank": args.rank}}
        one = TinkerBackend(options)
        two = TinkerBackend(options)
        two.use_policies({"judge": PolicySection()})
        await one.start()
        await two.start()
        vocab = 100
        ratios, t_one, t_two = [], [], []
        for step in range(args.steps + 1):
            seqs = batch(args.sequences, args.length, vocab, step)
            started = time.perf_counter()
            await one.train_step(seqs, algo)
            await one.sync_weights()
            a = time.perf_counter() - started
            seqs = batch(args.sequences, args.length, vocab, step)
            half = len(seqs) // 2
            started = time.perf_counter()
            await two.train_policy_step("default", seqs[:half], algo)
            await two.train_policy_step("judge", seqs[half:], algo)
            await two.sync_weights()
            b = time.perf_counter() - started
            if step:  # the first step plans memory and warms up
                t_one.append(a)
                t_two.append(b)
                ratios.append(b / a)
        await one.close()
        await two.close()
    print(f"one policy:   {statistics.median(t_one) * 1000:.1f} ms/step (median of {len(t_one)})")
    print(f"two policies: {statistics.median(t_two) * 1000:.1f} ms/step")
    print(f"ratio two/one: {statistics.median(ratios):.2f}x (target <= 1.3x)")


# Each cookbook's roles, and the one given its own policy (its configs/two_policies.yaml's mapping).
ROLES = {"solver-judge": ("solver_0", "solver_1", "judge"), "guess-number": ("picker", "guesser")}
OWN_POLICY = {"solver-judge": "judge", "guess-number": "guesser"}


def curve(out: Path, args: argparse.Namespace, separate: bool) -> list[dict]:
    """One solver-judge run; its metrics rows."""
    overrides = [
        "progress=false",
        "plot=false",
        "tensorboard=false",
        "val_every=0",
        "ckpt_every=0",
        f"sample_groups={args.tasks}",  # every group: each role's reward is read from the samples
        f"seed={args.seed}",
        f"total_steps={args.curve_steps}",
        f"tasks_per_step={args.tasks}",
        f"group_size={args.group}",
        f"rollout.sampling.max_tokens={args.max_tokens}",
        "backend.options.lora.rank=4",
        "backend.options.learning_rate=0.02",
        "algorithm.filter_zero_variance=false",
    ]
    if separate:
        own = OWN_POLICY[args.cookbook]
        overrides += [f"policies.{own}.learning_rate=0.02", f"roles.{own}={own}"]
    trainer = build_trainer(args.cookbook, out_dir=str(out), overrides=overrides)
    asyncio.run(trainer.fit())
    rows = read_metrics(out / "metrics.jsonl")
    for row in rows:
        row["roles"] = role_rewards(out, row["step"], ROLES[args.cookbook])
    return rows


def role_rewards(out: Path, step: int, roles: tuple[str, ...]) -> str:
    """Each role's mean trajectory reward on ``step``, from the step's sample (every group)."""
    sample = read_episode_sample(sample_path(out, step))
    rewards: dict[str, list[float]] = {}
    for episode in sample.episodes:
        for trajectory in episode.trajectories:
            if trajectory.reward is not None:
                rewards.setdefault(trajectory.role, []).append(trajectory.reward)
    return " ".join(f"{r}={statistics.fmean(rewards[r]):.2f}" for r in roles if r in rewards)


def curves(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        runs = {}
        for name, separate in (("one shared policy", False), ("two policies", True)):
            started = time.perf_counter()
            runs[name] = curve(Path(tmp) / name.replace(" ", "_"), args, separate)
            print(f"{name}: {args.curve_steps} steps in {time.perf_counter() - started:.0f} s")
    for name, rows in runs.items():
        print(f"\n{name}: step reward/mean correct/fraction")
        for row in rows:
            print(f"  {row['step']:3d} {row['reward/mean']:.3f} {row['correct/fraction']:.3f} {row['roles']}")
    for name, rows in runs.items():
        tail = rows[-args.tail :]
        final = statistics.fmean(row["reward/mean"] for row in tail)
        print(f"final reward ({name}, mean of the last {len(tail)} steps): {final:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--part", choices=["cost", "curves"], default="cost")
    parser.add_argument("--sequences", type=int, default=32)
    parser.add_argument("--length", type=int, default=96)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--curve-steps", type=int, default=12)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--tail", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cookbook", choices=sorted(ROLES), default="solver-judge")
    args = parser.parse_args()
    if args.part == "cost":
        asyncio.run(cost(args))
    else:
        curves(args)


if __name__ == "__main__":
    main()
