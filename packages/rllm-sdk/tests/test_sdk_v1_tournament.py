"""V1 tournaments against a simulated verifier (a fake: accuracy p on mixed pairs, position bias b).

Rates are measured over many tournaments with fixed seeds, so a run is deterministic; the bounds
sit several standard deviations from the expected rate, so they hold for any seed too.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rllm.sdk.v1 import FORMATS, V1Settings, Verdict, allocate, majority_vote, run_tournament


def simulated_verifier(correct: list[bool], p: float, bias: float, rng: random.Random):
    """Says "A" with probability ``bias`` whatever it is shown; otherwise names the correct one of a
    mixed pair with probability ``p``, and answers at random on a pair with no correct side."""

    async def verify(first: int, second: int) -> Verdict:
        if rng.random() < bias:
            return Verdict.A
        if correct[first] != correct[second]:
            right = Verdict.A if correct[first] else Verdict.B
            if rng.random() < p:
                return right
            return Verdict.B if right is Verdict.A else Verdict.A
        return rng.choice([Verdict.A, Verdict.B, Verdict.TIE])

    return verify


def win_rate(
    fmt: str, n: int, k: int, p: float, bias: float, budget: int, trials: int, seed: int = 0
) -> float:
    async def run_all() -> float:
        rng = random.Random(seed)
        hits = 0
        for t in range(trials):
            correct = [False] * n
            for i in rng.sample(range(n), k):
                correct[i] = True
            verify = simulated_verifier(correct, p, bias, rng)
            result = await run_tournament(n, verify, budget=budget, format=fmt, seed=seed * 100_003 + t)
            assert result.calls <= budget
            hits += correct[result.winner]
        return hits / trials

    return asyncio.run(run_all())


def bound(rate: float, trials: int) -> float:
    """Five standard deviations of a binomial proportion: never crossed by chance in practice."""
    return 5 * math.sqrt(rate * (1 - rate) / trials)


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(1, 9),
    budget=st.integers(0, 40),
    fmt=st.sampled_from(FORMATS),
    both_orders=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_the_budget_is_never_exceeded_and_the_ranking_is_a_permutation(
    n: int, budget: int, fmt: str, both_orders: bool, seed: int
) -> None:
    rng = random.Random(seed)
    correct = [rng.random() < 0.4 for _ in range(n)]
    result = asyncio.run(
        run_tournament(
            n,
            simulated_verifier(correct, 0.7, 0.2, rng),
            budget=budget,
            format=fmt,
            both_orders=both_orders,
            seed=seed,
        )
    )
    assert result.calls <= budget
    assert sorted(result.ranking) == list(range(n)) and result.winner == result.ranking[0]
    assert all(c.first != c.second for c in result.comparisons)


@settings(max_examples=100, deadline=None)
@given(n=st.integers(2, 12), data=st.data(), seed=st.integers(0, 2**16))
def test_a_perfect_verifier_always_crowns_a_correct_candidate(n: int, data: st.DataObject, seed: int) -> None:
    k = data.draw(st.integers(1, n))
    rng = random.Random(seed)
    correct = [i < k for i in range(n)]
    rng.shuffle(correct)
    knockout = asyncio.run(
        run_tournament(
            n, simulated_verifier(correct, 1.0, 0.0, rng), budget=n - 1, format="knockout", seed=seed
        )
    )
    assert correct[knockout.winner] and knockout.calls == n - 1
    pairs = n * (n - 1) // 2
    league = asyncio.run(
        run_tournament(
            n, simulated_verifier(correct, 1.0, 0.0, rng), budget=pairs, format="all_pairs", seed=seed
        )
    )
    assert correct[league.winner] and league.calls == pairs
    # Every correct candidate ranks above every wrong one.
    assert sorted(league.ranking[:k]) == sorted(i for i in range(n) if correct[i])


def test_knockout_finds_the_correct_candidate_at_the_expected_rate() -> None:
    # One correct of 8: it must win 3 matches; with both orders and ties to a random seed, one
    # match is won with probability q = b/2 + (1 - b) p, so the rate is q ** 3.
    trials = 400
    for p, bias in ((0.8, 0.0), (0.9, 0.5)):
        q = bias / 2 + (1 - bias) * p
        rate = win_rate("knockout", 8, 1, p, bias, budget=14, trials=trials)
        assert abs(rate - q**3) <= bound(q**3, trials), (p, bias, rate, q**3)


def test_swiss_beats_a_random_pick_and_tracks_verifier_accuracy() -> None:
    trials = 300
    strong = win_rate("swiss", 8, 2, 0.9, 0.0, budget=24, trials=trials)
    weak = win_rate("swiss", 8, 2, 0.6, 0.0, budget=24, trials=trials)
    biased = win_rate("swiss", 8, 2, 0.9, 0.5, budget=24, trials=trials)
    random_pick = 2 / 8
    assert strong >= 0.75, strong
    assert weak > random_pick + bound(random_pick, trials), weak
    assert strong > weak + bound(0.5, trials)
    assert biased > random_pick + bound(random_pick, trials), biased


def test_a_pure_position_bias_picks_no_favourite() -> None:
    # A verifier that always says "A" is asked each pair in both orders: every match is a draw,
    # so no candidate (and no index) is favoured; the winner is a fair draw among all N.
    trials, n = 800, 4

    async def run_all() -> Counter:
        wins: Counter = Counter()
        for t in range(trials):
            result = await run_tournament(
                n, simulated_verifier([False] * n, 0.5, 1.0, random.Random(t)), budget=12, seed=t
            )
            assert set(result.scores) == {result.scores[0]}
            wins[result.winner] += 1
        return wins

    wins = asyncio.run(run_all())
    share = 1 / n
    assert all(abs(wins[i] / trials - share) <= bound(share, trials) for i in range(n)), wins


def test_without_budget_the_prior_decides() -> None:
    async def never(first: int, second: int) -> Verdict:
        raise AssertionError("no budget, no calls")

    for fmt in FORMATS:
        result = asyncio.run(run_tournament(4, never, budget=0, format=fmt, prior=[1, 3, 2, 1], seed=1))
        assert result.winner == 1 and result.calls == 0


@given(pairings=st.integers(0, 50), remaining=st.integers(0, 120), both=st.booleans())
def test_allocate_stays_within_the_calls_left(pairings: int, remaining: int, both: bool) -> None:
    played, doubled = allocate(pairings, remaining, both)
    assert 0 <= doubled <= played <= pairings and played + doubled <= remaining
    assert played == min(pairings, remaining)
    assert doubled == (min(played, remaining - played) if both else 0)


def test_majority_vote_clusters_answers_and_never_picks_no_answer() -> None:
    result = majority_vote(["4", " 4", "5", None, None, None], seed=0)
    assert result.votes == [2, 2, 1, 0, 0, 0] and result.winner in (0, 1)
    assert majority_vote([None, None], seed=3).winner in (0, 1)
    picks = {majority_vote(["1", "2"], seed=s).winner for s in range(20)}
    assert picks == {0, 1}  # a tie is broken at random, not by position


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"n": 0}, "n"),
        ({"budget": -1}, "budget"),
        ({"format": "ladder"}, "format"),
        ({"verify_role": "a/b"}, "role"),
    ],
)
def test_bad_settings_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        V1Settings(**kwargs)


def test_bad_tournament_input_is_refused() -> None:
    async def verify(first: int, second: int) -> Verdict:
        return Verdict.A

    with pytest.raises(ValueError, match="budget"):
        asyncio.run(run_tournament(3, verify, budget=-1))
    with pytest.raises(ValueError, match="prior"):
        asyncio.run(run_tournament(3, verify, budget=2, prior=[1.0]))

    async def sloppy(first: int, second: int) -> str:
        return "A"

    with pytest.raises(TypeError, match="Verdict"):
        asyncio.run(run_tournament(2, sloppy, budget=1))
