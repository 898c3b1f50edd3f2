"""Benchmark: rllm-algos' vectorised GRPO/RLOO advantages vs verl's core_algos, same inputs, one run.

1,000,000 trajectories in groups of 8 (125,000 groups), one outcome reward each. verl gets what
its trainer passes: token_level_rewards [N, 1] (the score on the response's only token), a
response mask and an index of uid strings. Ours gets the same rewards with an int group index
(what ``compute_advantages`` builds from TrajectoryGroups) - and, for completeness, the uid
strings themselves (``RewardBatch.from_group_ids``). Prints times, ratio and max abs difference.
Target: >= 10x faster, max abs difference <= 1e-6.

Needs verl (CPU is enough). Run it in the verl environment, from the repository root:

    UV_PROJECT_ENVIRONMENT=/tmp/verlenv uv sync --locked --no-default-groups --group dev \
        --package rllm-backend-verl --extra verl
    /tmp/verlenv/bin/python benchmarks/advantages.py            # --n 1000000 --group 8 --dtype float64

(or ``nox -s verl-reference`` builds the same environment under .nox/). Not a test: no timing
is asserted anywhere.
"""

from __future__ import annotations

import argparse
import platform
import time
from collections.abc import Callable

import numpy as np
import torch
from verl.trainer.ppo import core_algos

from rllm.algos import AlgorithmConfig, RewardBatch, get_estimator


def _best_of(fn: Callable[[], object], repeats: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="trajectories")
    parser.add_argument("--group", type=int, default=8, help="trajectories per group")
    parser.add_argument(
        "--dtype",
        choices=["float32", "float64"],
        default="float64",
        help="verl's tensor dtype (ours always computes in float64)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="best-of for our (fast) side")
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))

    rng = np.random.default_rng(0)
    n, k = args.n - args.n % args.group, args.group
    # Half binary (pass/fail) tasks, half graded rewards, in shuffled order: groups interleave.
    rewards = np.where(rng.random(n // k).repeat(k) < 0.5, rng.integers(0, 2, n), rng.random(n))
    rewards = rewards.astype(args.dtype).astype(np.float64)  # identical values on both sides
    group = np.repeat(np.arange(n // k), k)
    perm = rng.permutation(n)
    rewards, group = rewards[perm], group[perm]
    uids = np.array([f"uid-{g}" for g in group], dtype=object)
    token_rewards = torch.tensor(rewards, dtype=getattr(torch, args.dtype))[:, None]
    mask = torch.ones_like(token_rewards)
    config = AlgorithmConfig()

    print(
        f"{n:,} trajectories, groups of {k}, verl dtype {args.dtype}; "
        f"{platform.machine()}, torch threads {torch.get_num_threads()}, numpy {np.__version__}"
    )
    print(
        f"{'estimator':<8} {'verl loop (s)':>14} {'ours (s)':>10} {'ratio':>8} {'max |diff|':>11}   "
        f"{'ours from uids (s)':>18} {'verl vectorized (s)':>20}"
    )
    for name, verl_fn, verl_vec in (
        (
            "grpo",
            core_algos.compute_grpo_outcome_advantage,
            core_algos.compute_grpo_vectorized_outcome_advantage,
        ),
        (
            "rloo",
            core_algos.compute_rloo_outcome_advantage,
            core_algos.compute_rloo_vectorized_outcome_advantage,
        ),
    ):
        estimator = get_estimator(name).fn
        t_ours, ours = _best_of(
            lambda e=estimator: e(RewardBatch(rewards, group, n // k), config), args.repeats
        )
        t_uids, ours_uids = _best_of(
            lambda e=estimator: e(RewardBatch.from_group_ids(rewards, uids), config), 1
        )
        t0 = time.perf_counter()
        theirs, _ = verl_fn(token_rewards.clone(), mask, uids)
        t_verl = time.perf_counter() - t0
        t_vec, _ = _best_of(lambda f=verl_vec: f(token_rewards.clone(), mask, uids), 1)
        theirs = theirs[:, 0].double().numpy()
        diff = float(np.abs(ours - theirs).max())
        assert np.array_equal(ours, ours_uids)
        print(
            f"{name:<8} {t_verl:>14.3f} {t_ours:>10.4f} {t_verl / t_ours:>7.0f}x {diff:>11.2e}   "
            f"{t_uids:>18.3f} {t_vec:>20.3f}"
        )


if __name__ == "__main__":
    main()
