"""What every tournament format plays with: a Match spends the verification budget on pairings
and logs each call as a Comparison (kept apart from the formats, so each imports it alone)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from rllm.sdk.v1.verdict import Verdict
from rllm.types.errors import InputError, UsageError

Verifier = Callable[[int, int], Awaitable[Verdict | None]]


@dataclass(frozen=True)
class Comparison:
    """One verification call: ``first`` was shown as A, ``second`` as B."""

    first: int
    second: int
    verdict: Verdict | None
    round: int


class Match:
    """Plays pairings concurrently, spending the budget, and logs every call."""

    def __init__(self, verify: Verifier, budget: int, rng: random.Random) -> None:
        self.verify, self.remaining, self.rng = verify, budget, rng
        self.log: list[Comparison] = []

    async def play(self, pairs: Sequence[tuple[int, int]], doubled: int, round_no: int) -> list[float]:
        """Each pair's share of points for its first member, in [0, 1]; the first ``doubled``
        pairs are asked in both orders. Raises ValueError if the calls exceed the budget."""
        calls: list[tuple[int, int, int]] = []  # (pair index, shown as A, shown as B)
        for k, (i, j) in enumerate(pairs):
            if k < doubled:
                calls += [(k, i, j), (k, j, i)]
            else:
                calls.append((k, i, j) if self.rng.random() < 0.5 else (k, j, i))
        if len(calls) > self.remaining:
            raise InputError(f"{len(calls)} verification calls exceed the remaining budget {self.remaining}")
        self.remaining -= len(calls)
        verdicts = await asyncio.gather(*(self.verify(a, b) for _, a, b in calls))
        points = [0.0] * len(pairs)
        asked = [0] * len(pairs)
        for (k, a, b), verdict in zip(calls, verdicts, strict=True):
            if verdict is not None and not isinstance(verdict, Verdict):
                raise UsageError(f"a verifier must return a Verdict or None, got {verdict!r}")
            self.log.append(Comparison(a, b, verdict, round_no))
            first_shown = a == pairs[k][0]
            if verdict is Verdict.A:
                won = first_shown
            elif verdict is Verdict.B:
                won = not first_shown
            else:
                points[k] += 0.5
                asked[k] += 1
                continue
            points[k] += 1.0 if won else 0.0
            asked[k] += 1
        return [p / n for p, n in zip(points, asked, strict=True)]
