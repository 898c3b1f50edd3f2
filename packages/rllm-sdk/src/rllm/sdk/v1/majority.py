"""Best-of-N by majority vote: the baseline a tournament has to beat.

Candidates are clustered by their final answer (``None`` = no answer, which never wins while
any candidate has one); the largest cluster wins, ties broken at random (seeded).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from rllm.types.errors import InputError


@dataclass(frozen=True)
class MajorityResult:
    """The chosen candidate and, for each candidate, how many candidates share its answer."""

    winner: int
    votes: list[int]


def majority_vote(
    answers: Sequence[str | None],
    *,
    key: Callable[[str], Hashable] = str.strip,
    seed: int | None = None,
) -> MajorityResult:
    """Pick a candidate of the most common answer (``key`` normalises answers before counting)."""
    if not answers:
        raise InputError("majority_vote needs at least one candidate answer")
    keys = [None if a is None else key(a) for a in answers]
    counts: dict[Hashable, int] = {}
    for k in keys:
        if k is not None:
            counts[k] = counts.get(k, 0) + 1
    votes = [0 if k is None else counts[k] for k in keys]
    best = max(votes)
    tied = [i for i, v in enumerate(votes) if v == best]
    return MajorityResult(winner=random.Random(seed).choice(tied), votes=votes)
