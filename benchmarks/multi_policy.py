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
whose rewards a tiny model does earn. ``--real`` draws the solver-judge curves on a real model
(SmolLM2-135M-Instruct after a format-only warm start, below), kept in ``--out``.

SmolLM2-135M-Instruct (the real-model fixture, no hub download) never writes the judge's
``<choice>k</choice>`` on its own (0 of 40 tries) and boxes few answers, so neither role would earn
a reward. A **format-only warm start** fixes that without teaching the task:

1. the base model answers ``--warm-questions`` additions greedily (transformers, batched); its own
   final number is kept, right or wrong, and the share right is printed (the base accuracy);
2. one LoRA SFT run (`rllm sft`, the user path) on the flow's exact prompts: each solver reply is
   ``a + b = N. The answer is \\boxed{N}.`` with N the model's *own* answer, and each judge reply
   ``<choice>k</choice>`` with k drawn at random for a pair of such solutions (the model's answer
   and a near miss, in random order) — the formats, never a preference for the right one;
3. `rllm export` merges it into a model folder; both RL arms start from that folder, each with a
   fresh LoRA (one adapter shared by every role, or the judge on its own adapter).

The tasks are ``What is a + b?`` with 1 <= a <= ``--a-max`` (19) and 1 <= b <= ``--b-max`` (9),
held apart from the warm-start questions: in reach of a 135M model (greedy, it got 14 of 32 right
before any training; two-digit sums it gets about 1 in 8), so the solvers start well above 0 and
the judge sees pairs where exactly one solution is right.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rllm.algos.config import AlgorithmConfig
from rllm.backends.tinker import TinkerBackend
from rllm.engine.training.launch import build_trainer
from rllm.engine.training.metrics_log import read_episode_sample, read_metrics, sample_path
from rllm.engine.training.policies import PolicySection
from rllm.tiny import init_tiny_model
from rllm.types import FloatArray, Task, TokenArray, TrainSequence


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


# The real model's warm start and tasks (the module docstring's --real).
_NUMBER = re.compile(r"-?\d+")


def split_pairs(warm: int, a_max: int, b_max: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Every (a, b) with 1 <= a <= ``a_max`` and 1 <= b <= ``b_max``, in a fixed shuffled order:
    the first ``warm`` are the warm-start questions, the rest the RL tasks (disjoint)."""
    pairs = [(a, b) for a in range(1, a_max + 1) for b in range(1, b_max + 1)]
    random.Random("multi-policy-real").shuffle(pairs)
    if not 0 < warm < len(pairs):
        raise SystemExit(f"--warm-questions must be between 1 and {len(pairs) - 1}, got {warm}")
    return pairs[:warm], pairs[warm:]


def question(a: int, b: int) -> str:
    return f"What is {a} + {b}?"


def solver_prompt(a: int, b: int) -> str:
    from rllm_cookbook_solver_judge import solver_prompt as flow_prompt

    return flow_prompt(question(a, b))


def solver_reply(a: int, b: int, answer: int) -> str:
    return f"{a} + {b} = {answer}. The answer is \\boxed{{{answer}}}."


def own_answers(model: Path, pairs: list[tuple[int, int]], threads: int) -> list[int | None]:
    """The base model's greedy final number for each question (None: it wrote no number)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(model)
    tokenizer.padding_side = "left"
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    lm = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    answers: list[int | None] = []
    for start in range(0, len(pairs), 32):
        chunk = pairs[start : start + 32]
        texts = [
            tokenizer.apply_chat_template(
                [{"role": "user", "content": solver_prompt(a, b)}], tokenize=False, add_generation_prompt=True
            )
            for a, b in chunk
        ]
        batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.inference_mode():
            ids = lm.generate(**batch, max_new_tokens=48, do_sample=False, pad_token_id=pad)  # pyright: ignore[reportAttributeAccessIssue]
        for row in ids[:, batch["input_ids"].shape[1] :]:
            numbers = _NUMBER.findall(tokenizer.decode(row, skip_special_tokens=True))
            answers.append(int(numbers[-1]) if numbers else None)
    return answers


def warm_start_chats(
    pairs: list[tuple[int, int]], answers: list[int | None], seed: int
) -> list[dict[str, Any]]:
    """Format-only SFT conversations: each solver reply carries the model's own answer, each judge
    reply a random choice between that answer and a near miss."""
    from rllm_cookbook_solver_judge import judge_prompt

    rng = random.Random(seed)
    chats: list[dict[str, Any]] = []
    for (a, b), own in zip(pairs, answers, strict=True):
        if own is None:
            continue
        chats.append(
            {
                "messages": [
                    {"role": "user", "content": solver_prompt(a, b)},
                    {"role": "assistant", "content": solver_reply(a, b, own)},
                ]
            }
        )
        miss = own + rng.choice([-10, -1, 1, 10])
        solutions = [solver_reply(a, b, own), solver_reply(a, b, miss)]
        rng.shuffle(solutions)
        pick = rng.randint(1, 2)
        chats.append(
            {
                "messages": [
                    {"role": "user", "content": judge_prompt(question(a, b), solutions)},
                    {"role": "assistant", "content": f"<choice>{pick}</choice>"},
                ]
            }
        )
    return chats


def rllm(*argv: str) -> None:
    """One `rllm` command, as a user runs it; a failure ends the benchmark with its exit code."""
    command = [sys.executable, "-m", "rllm.cli.main", *argv]
    print("$ rllm " + " ".join(argv), flush=True)
    done = subprocess.run(command, check=False)
    if done.returncode != 0:
        raise SystemExit(f"`rllm {argv[0]}` exited {done.returncode}")


def warm_start(out: Path, base: Path, pairs: list[tuple[int, int]], threads: int) -> Path:
    """The format-only warm start (module docstring), exported as a model folder."""
    answers = own_answers(base, pairs, threads)
    right = sum(own == a + b for (a, b), own in zip(pairs, answers, strict=True))
    numbered = sum(own is not None for own in answers)
    print(
        f"base model, greedy: {right}/{len(pairs)} right, {numbered}/{len(pairs)} end in a number", flush=True
    )
    chats = warm_start_chats(pairs, answers, seed=0)
    data = out / "warm_start.jsonl"
    data.write_text("".join(json.dumps(chat) + "\n" for chat in chats))
    rllm(
        "sft", str(data), "--model", str(base), "--out", str(out / "sft"),
        "epochs=2", "batch_tokens=2048", "progress=false",
        "backend.options.lora.rank=16", "backend.options.learning_rate=1e-3",
        "backend.options.micro_batch_tokens=256", "backend.options.gradient_checkpointing=true",
        f"backend.options.torch_threads={threads}",
    )  # fmt: skip
    rllm("export", str(out / "sft"), "--to", str(out / "warm"))
    return out / "warm"


def addition_cookbook(pairs: list[tuple[int, int]]) -> Any:
    """The solver-judge cookbook (flow, evaluator, per-role estimators) on these additions."""
    from rllm_cookbook_solver_judge import cookbook

    tasks = [Task(id=f"add-{a}-{b}", instruction=question(a, b), ground_truth=a + b) for a, b in pairs]
    return dataclasses.replace(cookbook, load_tasks=lambda split: tasks)


def real_overrides(model: Path, threads: int) -> list[str]:
    """The real model's settings (the math cookbook's CPU preset: LoRA 16, small micro-batches)."""
    return [
        f"backend.options.model={model}",
        "backend.options.lora.rank=16",
        "backend.options.micro_batch_tokens=256",
        "backend.options.gradient_checkpointing=true",
        f"backend.options.torch_threads={threads}",
        "rollout.deadline_s=3600",
    ]


def judge_parsed(episodes: list[Any]) -> float:
    """The share of episodes whose judge reply held a usable ``<choice>``."""
    return sum(e.artifacts.get("choice") is not None for e in episodes) / max(1, len(episodes))


def curve(
    out: Path,
    args: argparse.Namespace,
    separate: bool,
    real: tuple[Path, list[tuple[int, int]]] | None = None,
) -> list[dict]:
    """One run (on ``real``'s model and additions when given); its metrics rows."""
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
        "algorithm.filter_zero_variance=false",
    ]
    lr = 1e-3 if real else 0.02  # the CPU preset's LoRA rate on the real model
    overrides += real_overrides(real[0], 2) if real else ["backend.options.lora.rank=4"]
    overrides.append(f"backend.options.learning_rate={lr}")
    if separate:
        own = OWN_POLICY[args.cookbook]
        overrides += [f"policies.{own}.learning_rate={lr}", f"roles.{own}={own}"]
    cookbook = addition_cookbook(real[1]) if real else None
    trainer = build_trainer(args.cookbook, out_dir=str(out), overrides=overrides, cookbook=cookbook)
    asyncio.run(trainer.fit())
    rows = read_metrics(out / "metrics.jsonl")
    for row in rows:
        row["roles"] = role_rewards(out, row["step"], ROLES[args.cookbook])
        if real:
            row["roles"] += (
                f" judge_parsed={judge_parsed(read_episode_sample(sample_path(out, row['step'])).episodes):.2f}"
            )
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
        folder = Path(args.out) if args.real else Path(tmp)
        real = None
        if args.real:
            if args.cookbook != "solver-judge":
                raise SystemExit("--real draws the solver-judge curves only")
            warm, tasks = split_pairs(args.warm_questions, args.a_max, args.b_max)  # refused before any write
            if folder.exists() and any(folder.iterdir()):
                raise SystemExit(f"--out {folder} holds an earlier run: give an empty or new folder")
            folder.mkdir(parents=True, exist_ok=True)
            from rllm.testing.real_model import smollm2_model

            real = (warm_start(folder, smollm2_model(), warm, threads=2), tasks)
        runs = {}
        for name, separate in (("one shared policy", False), ("two policies", True)):
            started = time.perf_counter()
            runs[name] = curve(folder / name.replace(" ", "_"), args, separate, real)
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
    parser.add_argument("--real", action="store_true", help="curves on SmolLM2-135M-Instruct (warm start)")
    parser.add_argument("--out", default="runs/multi-policy-real", help="--real: the benchmark's folder")
    parser.add_argument("--warm-questions", type=int, default=64, help="--real: warm-start questions")
    parser.add_argument("--a-max", type=int, default=19, help="--real: the first addend's largest value")
    parser.add_argument("--b-max", type=int, default=9, help="--real: the second addend's largest value")
    args = parser.parse_args()
    if args.part == "cost":
        asyncio.run(cost(args))
    else:
        curves(args)


if __name__ == "__main__":
    main()
