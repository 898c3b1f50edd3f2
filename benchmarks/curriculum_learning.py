"""RL from scratch on `say-single` (the config where RL levels off: benchmarks/RESULTS.md,
"distill_vs_rl.py", arm (a)) with the engine's ways of spending rollouts where they teach:
plain vs `rollout.curriculum` vs `algorithm.dynamic_sampling` vs both, per seed.

Everything runs through `rllm train` (a subprocess per arm), as a user types it. The fresh student
is built once (the tiny model `rllm sft` builds from `say: WORD` chats with seed 0, as
distill_vs_rl.py's student: the same words in the same order), shared by every arm and seed; a
seed changes the sampling. Each arm's command is watched while it runs and stopped once the
trailing ``--window``-step mean of ``reward/task_mean`` (each task's mean reward, averaged: the
curriculum draws some tasks more often and dynamic sampling adds groups, so ``reward/mean`` would
not compare across arms) reaches ``--target``, or after ``--max-steps``; its wall time to the
target counts from the command's start (start-up included, reported beside it; one untimed
2-step run first takes the machine's cold start, which would otherwise fall on the first arm).
The run prints steps and wall seconds to the target and the final reward (the last window's mean) per arm and
seed, then per arm the seeds that reached the target and the median wall time to it over plain's
median, and the median of its per-seed ratio to plain's on the seeds plain reaches (paired).
Target (issue #51): with the curriculum (or both) every seed reaches 0.9, and the median wall
time to 0.9 is <= 0.7x plain's where plain gets there.

    uv run --no-sync python benchmarks/curriculum_learning.py --seeds 0 1 2
    uv run --no-sync python benchmarks/curriculum_learning.py --seeds 0 --max-steps 3   # smoke
    uv run --no-sync python benchmarks/curriculum_learning.py --arms plain curriculum --set rollout.curriculum.solved_weight=0.05
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from distill_vs_rl import QUIET, WORDS, command, run_to_target

METRIC = "reward/task_mean"
ARMS: dict[str, list[str]] = {
    "plain": [],
    "curriculum": ["rollout.curriculum.enabled=true"],
    "dynamic": ["algorithm.dynamic_sampling.enabled=true"],
    "both": ["rollout.curriculum.enabled=true", "algorithm.dynamic_sampling.enabled=true"],
}


def fresh_student(work: Path) -> Path:
    """The tiny model distill_vs_rl.py's `rllm sft` builds (its words in first-seen order, seed 0)."""
    from rllm.backends.tinker import TinkerBackend

    path = work / "student"
    if not (path / "config.json").is_file():
        TinkerBackend.init_tiny_model(path, vocab_words=["say", ":", *WORDS], seed=0)
    return path


def arm_args(arm: str, opts: argparse.Namespace, model: Path, seed: int) -> list[str]:
    return [
        "train",
        "say-single",
        "--out",
        arm,
        f"backend.options.model={model}",
        f"backend.options.learning_rate={opts.lr}",
        f"total_steps={opts.max_steps}",
        f"seed={seed}",
        *QUIET,
        *ARMS[arm],
        *(opts.set if arm != "plain" else []),
    ]


def run_arm(arm: str, seed: int, opts: argparse.Namespace, work: Path, env: dict[str, str]) -> dict[str, Any]:
    out = work / f"seed{seed}"
    out.mkdir(parents=True, exist_ok=True)
    args = arm_args(arm, opts, fresh_student(work), seed)
    result = run_to_target(args, out / arm, out, env, opts, metric=METRIC)
    rewards = result["rewards"]
    result["final_reward"] = round(statistics.fmean(rewards[-opts.window :]), 3) if rewards else None
    result["command"] = "rllm " + " ".join(args)
    rows = [json.loads(line) for line in (out / arm / "metrics.jsonl").read_text().splitlines() if line]
    if rows and "dynamic_sampling/capped" in rows[0]:
        result["capped_steps"] = sum(int(r["dynamic_sampling/capped"]) for r in rows)
        result["rollouts"] = sum(int(r["episodes"]) for r in rows)
    return result


def warm_up(opts: argparse.Namespace, work: Path, env: dict[str, str]) -> None:
    """Two untimed steps of the plain command first: the first `rllm train` on a machine pays a
    cold start (round 8: 9.3 s against 3.7–4.3 s for every later one), which would otherwise fall
    on whichever arm runs first."""
    args = arm_args("plain", opts, fresh_student(work), 0)
    args[args.index("--out") + 1] = "warm-up"
    args[args.index(f"total_steps={opts.max_steps}")] = "total_steps=2"
    shutil.rmtree(work / "warm-up", ignore_errors=True)
    subprocess.run(
        command(args), cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, check=True
    )


def summary(table: dict[int, dict[str, Any]], arms: list[str], target: float) -> list[str]:
    lines = []
    for seed, results in table.items():
        cells = []
        for arm in arms:
            r = results[arm]
            hit = (
                f"{r['steps_to_target']} steps, {r['wall_to_target_s']:.0f} s"
                if r["steps_to_target"]
                else "missed"
            )
            cells.append(f"{arm}: {hit} (final {r['final_reward']}, start-up {r['startup_s']:.0f} s)")
        lines.append(f"seed {seed}: " + "; ".join(cells))
    plain = [r["plain"]["wall_to_target_s"] for r in table.values() if "plain" in r]
    plain_hits = [w for w in plain if w is not None]
    for arm in arms:
        walls = [r[arm]["wall_to_target_s"] for r in table.values()]
        hits = [w for w in walls if w is not None]
        line = f"{arm}: {len(hits)} of {len(walls)} seeds reached {target}"
        if hits:
            line += f", median wall to {target} {statistics.median(hits):.1f} s"
        if hits and plain_hits and arm != "plain":
            line += f" ({statistics.median(hits) / statistics.median(plain_hits):.2f}x plain's median)"
            # Where plain gets there: the same seeds, each arm's wall over plain's (paired).
            paired = [
                r[arm]["wall_to_target_s"] / r["plain"]["wall_to_target_s"]
                for r in table.values()
                if r["plain"]["wall_to_target_s"] is not None and r[arm]["wall_to_target_s"] is not None
            ]
            if paired:
                line += f"; on the {len(paired)} seeds plain reaches: median {statistics.median(paired):.2f}x plain's"
        lines.append(line)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    parser.add_argument("--max-steps", type=int, default=150)
    parser.add_argument("--window", type=int, default=5)
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--lr", type=float, default=1e-3, help="distill_vs_rl.py's RL learning rate")
    parser.add_argument(
        "--set", nargs="+", default=[], metavar="KEY=VALUE", help="more overrides for every arm but plain"
    )
    parser.add_argument("--workdir", default="/tmp/rllm-curriculum-learning")
    opts = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds: the running arm is stopped
    work = Path(opts.workdir)
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "RLLM_HOME": str(work / "home")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as distill_vs_rl.py: compiled bytecode, as users have
    print(json.dumps({"settings": {arm: arm_args(arm, opts, work / "student", 0) for arm in opts.arms}}))
    warm_up(opts, work, env)
    table: dict[int, dict[str, Any]] = {}
    for seed in opts.seeds:
        # The arms' order turns with the seed, so no arm always runs first (a cold page cache).
        order = opts.arms[seed % len(opts.arms) :] + opts.arms[: seed % len(opts.arms)]
        table[seed] = {arm: run_arm(arm, seed, opts, work, env) for arm in order}
        (work / f"seed{seed}" / "results.json").write_text(json.dumps(table[seed], indent=2))
        print(json.dumps({seed: table[seed]}), flush=True)
    for line in summary(table, opts.arms, opts.target):
        print(line)


if __name__ == "__main__":
    main()
