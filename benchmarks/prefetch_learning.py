"""Does `rollout.prefetch` (or another boolean key, ``--key``) change what the README main job
learns per step? (#35 rounds 10 and 11)

Runs `rllm train say` (the main job: 32 tasks x 4, two flow processes, validation every 20 steps)
for ``--steps`` steps with KEY=false ("off") and KEY=true ("on"), same seed (``--vary-seed``:
seed + pair - 1 for each pair), alternating, ``--pairs`` times (the order flips every pair), every run at nice 19 unless --no-nice: steps, not wall times,
are compared, so others' load does not spoil it. Each run keeps every group's episodes
(`sample_groups=32`) for the independence check below.

Printed per run: train reward (mean of the last 10 steps), the fraction of all-wrong groups
(mean over all steps and over the second half), the first step whose 10-step mean reward reaches
0.8, greedy validation at steps 60 / 80 / 100, steps prefetched, the CPU seconds of the run
(children's user + sys), and the in-group independence check: over every group, how often two
rollouts of one task gave the same first reply (the turn whose prompt the group shares, the
rows that share a prefill when prefetch releases them together) against how often independent
draws would (each row's own sampler probability of its reply estimates sum_r p(r)^2 without bias:
E[p(r_i)] = sum_r p(r)^2). Then the on/off means over pairs, and the spread of each variant.

    uv run --no-sync python benchmarks/prefetch_learning.py --pairs 2 --out /tmp/prefetch_pairs
    uv run --no-sync python benchmarks/prefetch_learning.py --analyze /tmp/prefetch_pairs/*_off /tmp/prefetch_pairs/*_on
    uv run --no-sync python benchmarks/prefetch_learning.py --key algorithm.filter_zero_variance \
        --pairs 4 --vary-seed --out /tmp/filter_pairs
"""

from __future__ import annotations

import argparse
import math
import resource
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from rllm.engine.training.metrics_log import read_episode_sample, read_metrics, sample_steps


@dataclass
class RunSummary:
    name: str
    variant: str  # "on" / "off": KEY's value, from the run directory's name
    steps: int
    reward_last10: float
    all_wrong: float
    all_wrong_late: float
    first_08: int | None
    val: dict[int, float]
    prefetched: int
    same_reply: int  # pairs of one group's rollouts with the same first reply
    expected_same: float  # what independent draws would give
    pairs: int


def summarise(run: Path) -> RunSummary:
    rows = [r for r in read_metrics(run / "metrics.jsonl") if "reward/mean" in r]
    val = {
        int(r["step"]): float(r["val/reward/mean"])
        for r in read_metrics(run / "metrics.jsonl")
        if "val/reward/mean" in r
    }
    rewards = [float(r["reward/mean"]) for r in rows]
    wrong = [float(r["filter/frac_all_wrong"]) for r in rows]
    first = next(
        (i + 10 for i in range(len(rewards) - 9) if statistics.fmean(rewards[i : i + 10]) >= 0.8), None
    )
    same, expected, pairs = _independence(run)
    return RunSummary(
        name=run.name,
        variant=run.name.rsplit("_", 1)[-1],
        steps=len(rows),
        reward_last10=statistics.fmean(rewards[-10:]),
        all_wrong=statistics.fmean(wrong),
        all_wrong_late=statistics.fmean(wrong[len(wrong) // 2 :]),
        first_08=first,
        val=val,
        prefetched=int(sum(float(r.get("rollout/prefetched", 0.0)) for r in rows)),
        same_reply=same,
        expected_same=expected,
        pairs=pairs,
    )


def _independence(run: Path) -> tuple[int, float, int]:
    """Over every sampled group: pairs of rollouts whose first reply is the same, the number
    independent draws would give, and the number of pairs."""
    same, expected, pairs = 0, 0.0, 0
    for step in sample_steps(run):
        groups: dict[str, list[tuple[tuple[int, ...], float]]] = defaultdict(list)
        for episode in read_episode_sample(run / "samples" / f"step_{step:06d}.msgpack").episodes:
            first = (
                episode.trajectories[0].steps[0]
                if episode.trajectories and episode.trajectories[0].steps
                else None
            )
            if first is None or first.completion_ids is None or first.completion_logprobs is None:
                continue
            prob = math.exp(sum(float(x) for x in first.completion_logprobs))
            groups[episode.task_id].append((tuple(int(t) for t in first.completion_ids), prob))
        for rows in groups.values():
            n = len(rows)
            if n < 2:
                continue
            k = n * (n - 1) // 2
            same += sum(rows[i][0] == rows[j][0] for i in range(n) for j in range(i + 1, n))
            expected += k * statistics.fmean(p for _, p in rows)
            pairs += k
    return same, expected, pairs


def print_summaries(summaries: list[RunSummary], key: str) -> None:
    print(
        f"| run | {key} | train reward, last 10 steps | all-wrong groups (all / 2nd half) | first step 10-mean >= 0.8 "
        "| val 60 / 80 / 100 | prefetched | same first reply in a group: seen / independent |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for s in summaries:
        vals = " / ".join(f"{s.val[k]:.2f}" if k in s.val else "-" for k in (60, 80, 100))
        ratio = f" ({s.same_reply / s.expected_same:.2f}x)" if s.expected_same else ""
        print(
            f"| {s.name} | {s.variant} | {s.reward_last10:.3f} | {s.all_wrong:.3f} / "
            f"{s.all_wrong_late:.3f} | {s.first_08 or 'never'} | {vals} | {s.prefetched} | "
            f"{s.same_reply} / {s.expected_same:.1f} of {s.pairs} pairs{ratio} |"
        )
    for label in ("off", "on"):
        group = [s for s in summaries if s.variant == label]
        if not group:
            continue
        rewards = [s.reward_last10 for s in group]
        wrongs = [s.all_wrong for s in group]
        spread = f", sd {statistics.stdev(rewards):.3f}" if len(group) > 1 else ""
        print(
            f"{label}: {len(group)} runs, train reward (last 10 steps) mean {statistics.fmean(rewards):.3f}{spread} "
            f"(min {min(rewards):.3f}, max {max(rewards):.3f}); all-wrong groups mean {statistics.fmean(wrongs):.3f}"
        )


def run_pairs(args: argparse.Namespace) -> list[Path]:
    runs: list[Path] = []
    for pair in range(1, args.pairs + 1):
        order = ("off", "on") if pair % 2 else ("on", "off")
        for variant in order:
            out = args.out / f"pair{pair}_{variant}"
            command = [
                *([] if args.no_nice else ["nice", "-n", "19"]),
                *(["uv", "run", "--no-sync", "rllm", "train", "say"]),
                "--out", str(out), "--overwrite", "progress=false", f"total_steps={args.steps}",
                f"seed={args.seed + (pair - 1 if args.vary_seed else 0)}", "sample_groups=32",
                f"{args.key}={'true' if variant == 'on' else 'false'}",
            ]  # fmt: skip
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            started = time.perf_counter()
            with (args.out / f"pair{pair}_{variant}.log").open("w") as log:
                subprocess.run(command, check=True, stdout=log, stderr=subprocess.STDOUT)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
            load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else []
            print(
                f"pair {pair} {variant}: {time.perf_counter() - started:.0f} s wall, {cpu:.0f} CPU s, load {' '.join(load)}",
                flush=True,
            )
            runs.append(out)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--key", default="rollout.prefetch", help="the boolean config key compared")
    parser.add_argument("--vary-seed", action="store_true", help="pair k runs with seed + k - 1")
    parser.add_argument("--out", type=Path, default=Path("/tmp/prefetch_pairs"))
    parser.add_argument("--no-nice", action="store_true", help="run at normal priority")
    parser.add_argument(
        "--analyze", type=Path, nargs="+", help="summarise these run directories, run nothing"
    )
    args = parser.parse_args()
    if args.analyze:
        missing = [p for p in args.analyze if not (p / "metrics.jsonl").is_file()]
        if missing:
            sys.exit(f"--analyze: no metrics.jsonl in {missing[0]}")
        runs = list(args.analyze)
    else:
        args.out.mkdir(parents=True, exist_ok=True)
        runs = run_pairs(args)
    print_summaries([summarise(r) for r in runs], args.key)


if __name__ == "__main__":
    main()
