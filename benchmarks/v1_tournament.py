"""Benchmark: V1 tournaments (rllm.sdk.v1) vs majority vote and a random pick, same candidates.

A simulated verifier (accuracy ``p`` on mixed pairs, position bias ``b``: it says "A" with
probability b whatever it is shown, else judges; a pair of two right or two wrong candidates
gets a random verdict) ranks N candidates of which k are correct. Wrong candidates draw their
answer from ``--distractors`` wrong answers, so wrong answers can out-vote the right one.
Every format gets the same verification budget and is seeded by majority-vote counts, as
``solve_v1`` does. Prints the winner's accuracy per format and the ratio to majority vote,
first against verifier accuracy p, then against the budget. Not a test; nothing is asserted.

    uv run python benchmarks/v1_tournament.py            # --trials 1000 --n 8 --k 2
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import random
import time

from rllm.sdk.v1 import Verdict, majority_vote, run_tournament

FORMATS = ("swiss", "knockout", "all_pairs")


def simulated_verifier(correct: list[bool], p: float, bias: float, rng: random.Random):
    async def verify(first: int, second: int) -> Verdict:
        if rng.random() < bias:
            return Verdict.A
        if correct[first] != correct[second]:
            right = Verdict.A if correct[first] else Verdict.B
            return right if rng.random() < p else (Verdict.B if right is Verdict.A else Verdict.A)
        return rng.choice((Verdict.A, Verdict.B, Verdict.TIE))

    return verify


async def measure(
    n: int,
    k: int,
    p: float,
    bias: float,
    budget: int,
    trials: int,
    distractors: int,
    both_orders: bool = True,
    seeded: bool = True,
) -> dict[str, float]:
    """Winner accuracy of each format, majority vote, a random pick and pass@N over ``trials``."""
    rng = random.Random(12345)
    hits = dict.fromkeys((*FORMATS, "majority", "random", "pass@N"), 0.0)
    for t in range(trials):
        correct = [i < k for i in range(n)]
        rng.shuffle(correct)
        answers = ["right" if c else f"wrong{rng.randrange(distractors)}" for c in correct]
        majority = majority_vote(answers, seed=t)
        prior = [float(v) for v in majority.votes] if seeded else None
        for fmt in FORMATS:
            verify = simulated_verifier(correct, p, bias, rng)
            result = await run_tournament(
                n, verify, budget=budget, format=fmt, both_orders=both_orders, prior=prior, seed=t
            )
            hits[fmt] += correct[result.winner]
        hits["majority"] += correct[majority.winner]
        hits["random"] += k / n
        hits["pass@N"] += k > 0
    return {name: value / trials for name, value in hits.items()}


def row(label: str, acc: dict[str, float]) -> str:
    cells = " | ".join(f"{acc[name]:.3f}" for name in (*FORMATS, "majority", "random", "pass@N"))
    best = max(acc[f] for f in FORMATS)
    vs_majority = f"{best / acc['majority']:.2f}x" if acc["majority"] else "— (majority 0)"
    return f"| {label} | {cells} | {vs_majority} | {best / acc['random']:.2f}x |"


HEADER = (
    "| {} | swiss | knockout | all pairs | majority | random | pass@N | best / majority | best / random |\n"
    "|---|---|---|---|---|---|---|---|---|"
)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--distractors", type=int, default=20)
    ap.add_argument("--budget", type=int, default=None, help="calls per problem (default 2 * (n - 1))")
    args = ap.parse_args()
    n, k = args.n, args.k
    budget = args.budget or 2 * (n - 1)
    started = time.perf_counter()
    print(f"# N={n}, k={k} correct, {args.distractors} distractor answers, {args.trials} trials per cell")
    print(f"# {platform.python_version()} on {platform.machine()}\n")
    for bias in (0.0, 0.3):
        print(f"Winner accuracy vs verifier accuracy p (budget {budget} calls, position bias b={bias}):\n")
        print(HEADER.format("p"))
        for p in (0.55, 0.65, 0.75, 0.85, 0.95):
            print(
                row(f"{p:.2f}", await measure(n, k, p, bias, budget, args.trials, args.distractors)),
                flush=True,
            )
        print()
    p, bias = 0.75, 0.3
    print(f"Winner accuracy vs budget (p={p}, b={bias}):\n")
    print(HEADER.format("budget"))
    for calls in (n // 2, n - 1, 2 * (n - 1), n * 3, n * (n - 1) // 2, n * (n - 1)):
        print(row(str(calls), await measure(n, k, p, bias, calls, args.trials, args.distractors)), flush=True)
    print(f"\nPosition-bias control (p={p}, b=0.5, budget {budget}): both orders vs one random order\n")
    print(HEADER.format("orders"))
    for both in (True, False):
        acc = await measure(n, k, p, 0.5, budget, args.trials, args.distractors, both_orders=both)
        print(row("both" if both else "one", acc), flush=True)
    print(f"\nSeeding by majority votes (p={p}, b={bias}, budget {budget}): seeded vs unseeded\n")
    print(HEADER.format("seeding"))
    for seeded in (True, False):
        acc = await measure(n, k, p, bias, budget, args.trials, args.distractors, seeded=seeded)
        print(row("votes" if seeded else "none", acc), flush=True)
    print(f"\n# {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    asyncio.run(main())
