"""Tournaments over N candidates under a budget of pairwise verification calls.

A verifier is ``async verify(first, second) -> Verdict | None`` (candidate indices, ``first``
shown as solution A). Each call is one unit of budget; the budget is never exceeded. One call
gives its point to the candidate it names (half each for a tie or an unparsed reply). With
``both_orders`` a pairing is asked in both orders where the budget allows, so a verifier that
leans to one position cancels out instead of deciding the match; when only one order fits, the
order is drawn at random, so a lean is noise rather than a systematic edge.

Formats: ``swiss`` (rounds pairing equal scores, default), ``knockout`` (see
:mod:`rllm.sdk.v1.knockout`) and ``all_pairs`` (round robin). ``prior`` (e.g. majority-vote
counts) seeds the field and breaks ties; ``seed`` makes every random choice reproducible.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from rllm.sdk.v1.knockout import knockout
from rllm.sdk.v1.match import Comparison, Match, Verifier
from rllm.types.errors import InputError

TournamentFormat = Literal["swiss", "knockout", "all_pairs"]
FORMATS: tuple[str, ...] = ("swiss", "knockout", "all_pairs")


@dataclass
class TournamentResult:
    """The ranking (best first), its winner, each candidate's points and every call made."""

    format: str
    winner: int
    ranking: list[int]
    scores: list[float]
    comparisons: list[Comparison] = field(default_factory=list)
    rounds: int = 0
    budget: int = 0

    @property
    def calls(self) -> int:
        return len(self.comparisons)

    @property
    def unparsed(self) -> int:
        return sum(c.verdict is None for c in self.comparisons)


def allocate(pairings: int, remaining: int, both_orders: bool) -> tuple[int, int]:
    """(pairings played, pairings of those asked in both orders) within ``remaining`` calls."""
    played = max(0, min(pairings, remaining))
    doubled = max(0, min(played, remaining - played)) if both_orders else 0
    return played, doubled


def seed_order(n: int, prior: Sequence[float] | None, rng: random.Random) -> list[int]:
    """Candidates by descending prior, ties in a random (seeded) order."""
    shuffled = list(range(n))
    rng.shuffle(shuffled)
    if prior is None:
        return shuffled
    return sorted(shuffled, key=lambda c: -prior[c])


async def run_tournament(
    n: int,
    verify: Verifier,
    *,
    budget: int,
    format: TournamentFormat = "swiss",
    both_orders: bool = True,
    prior: Sequence[float] | None = None,
    seed: int | None = None,
    max_rounds: int | None = None,
) -> TournamentResult:
    """Rank ``n`` candidates with at most ``budget`` calls of ``verify``; return the result."""
    if n < 1:
        raise InputError(f"a tournament needs at least one candidate, got n={n}")
    if budget < 0:
        raise InputError(f"budget must be >= 0 verification calls, got {budget}")
    if format not in FORMATS:
        raise InputError(f"unknown tournament format {format!r}; known: {list(FORMATS)}")
    if prior is not None and len(prior) != n:
        raise InputError(f"prior has {len(prior)} values for {n} candidates")
    rng = random.Random(seed)
    order = seed_order(n, prior, rng)
    match = Match(verify, budget, rng)
    if format == "knockout":
        ranking, scores, rounds = await knockout(order, match, both_orders)
    elif format == "all_pairs":
        ranking, scores, rounds = await _all_pairs(order, match, both_orders)
    else:
        ranking, scores, rounds = await _swiss(order, match, both_orders, max_rounds)
    return TournamentResult(format, ranking[0], ranking, scores, match.log, rounds, budget)


async def _swiss(
    order: list[int], match: Match, both_orders: bool, max_rounds: int | None
) -> tuple[list[int], list[float], int]:
    n = len(order)
    rank = {c: r for r, c in enumerate(order)}
    score = [0.0] * n
    met: list[list[int]] = [[] for _ in range(n)]
    had_bye: set[int] = set()
    rounds = 0
    limit = n - 1 if max_rounds is None else max_rounds
    while rounds < limit and match.remaining > 0 and n > 1:
        standing = sorted(range(n), key=lambda c: (-score[c], rank[c]))
        bye = None
        if n % 2:  # the lowest-placed candidate without a bye sits out
            bye = next((c for c in reversed(standing) if c not in had_bye), standing[-1])
        pairs = _pair([c for c in standing if c != bye], score, met)
        played, doubled = allocate(len(pairs), match.remaining, both_orders)
        shares = await match.play(pairs[:played], doubled, rounds)
        for (i, j), share in zip(pairs, shares, strict=False):
            score[i] += share
            score[j] += 1.0 - share
            met[i].append(j)
            met[j].append(i)
        if bye is not None and played == len(pairs):
            # A bye counts as a draw: a free round must not lift a candidate over one that won.
            score[bye] += 0.5
            had_bye.add(bye)
        rounds += 1
    buchholz = [sum(score[o] for o in met[c]) for c in range(n)]
    ranking = sorted(range(n), key=lambda c: (-score[c], -buchholz[c], rank[c]))
    return ranking, score, rounds


def _pair(players: list[int], score: list[float], met: list[list[int]]) -> list[tuple[int, int]]:
    """Pairings down the standings: within each score group the top half meets the bottom half
    (so round 1 does not pit the two best-seeded candidates against each other), an odd one out
    floats down to the next group, and each avoids an opponent it has met when it can."""
    pairs: list[tuple[int, int]] = []
    carry: list[int] = []
    for _, members in itertools.groupby(players, key=lambda c: score[c]):
        group = carry + list(members)
        carry = [group.pop()] if len(group) % 2 else []
        half = len(group) // 2
        top, bottom = group[:half], group[half:]
        for i in top:
            k = next((x for x, j in enumerate(bottom) if j not in met[i]), 0)
            pairs.append((i, bottom.pop(k)))
    return pairs


async def _all_pairs(order: list[int], match: Match, both_orders: bool) -> tuple[list[int], list[float], int]:
    n = len(order)
    rank = {c: r for r, c in enumerate(order)}
    pairs = list(itertools.combinations(range(n), 2))
    match.rng.shuffle(pairs)
    played, doubled = allocate(len(pairs), match.remaining, both_orders)
    score = [0.0] * n
    shares = await match.play(pairs[:played], doubled, 0) if played else []
    for (i, j), share in zip(pairs, shares, strict=False):
        score[i] += share
        score[j] += 1.0 - share
    ranking = sorted(range(n), key=lambda c: (-score[c], rank[c]))
    return ranking, score, 1 if played else 0
