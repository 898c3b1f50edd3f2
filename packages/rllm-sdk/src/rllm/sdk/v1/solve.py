"""V1 through the gateway: N candidates, pairwise verification by the same model, a tournament.

Generation calls go to role ``generate`` and verification calls to role ``verify`` (see
:func:`rllm.sdk.role_url`), so the gateway records them as separately named trajectories and
:mod:`rllm.sdk.v1.credit` can reward each call on its own. Needs the ``openai`` extra.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from rllm.sdk.clients import async_openai
from rllm.sdk.rewards.boxed import extract_boxed
from rllm.sdk.session import sampling_kwargs, validate_role
from rllm.sdk.v1.majority import MajorityResult, majority_vote
from rllm.sdk.v1.tournament import FORMATS, TournamentFormat, TournamentResult, run_tournament
from rllm.sdk.v1.verdict import Verdict, pairwise_messages, parse_verdict
from rllm.types import AgentConfig
from rllm.types.errors import InputError

Messages = list[dict[str, Any]]


@dataclass(frozen=True)
class V1Settings:
    """How many candidates, how many verification calls, which tournament, which roles.

    ``budget`` defaults to ``2 * (n - 1)``: a knockout with every match asked in both orders.
    ``seed_by_votes`` seeds the tournament by majority-vote counts, which also break its ties:
    it falls back to majority vote where the verifier cannot decide, which hurts when wrong
    answers out-vote the right one (see benchmarks/RESULTS.md, "v1_tournament.py").
    """

    n: int = 4
    budget: int | None = None
    format: TournamentFormat = "swiss"
    both_orders: bool = True
    seed: int | None = None
    seed_by_votes: bool = True
    generate_role: str = "generate"
    verify_role: str = "verify"

    def __post_init__(self) -> None:
        if not isinstance(self.n, int) or self.n < 1:
            raise InputError(f"V1Settings.n must be an int >= 1, got {self.n!r}")
        if self.budget is not None and (not isinstance(self.budget, int) or self.budget < 0):
            raise InputError(f"V1Settings.budget must be an int >= 0, got {self.budget!r}")
        if self.format not in FORMATS:
            raise InputError(f"V1Settings.format must be one of {list(FORMATS)}, got {self.format!r}")
        validate_role(self.generate_role)
        validate_role(self.verify_role)

    @property
    def calls(self) -> int:
        return 2 * (self.n - 1) if self.budget is None else self.budget


@dataclass
class V1Outcome:
    """Everything one V1 run produced; ``artifacts()`` is what a flow returns for its evaluator."""

    candidates: list[str]
    answers: list[str | None]
    tournament: TournamentResult
    majority: MajorityResult
    # Verification prompt digest -> (shown as A, shown as B): how credit finds a traced call's pair.
    pairs_by_key: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def winner(self) -> int:
        return self.tournament.winner

    def artifacts(self) -> dict[str, Any]:
        t = self.tournament
        return {
            "answer": self.candidates[t.winner],
            "v1": {
                "candidates": self.candidates,
                "answers": self.answers,
                "winner": t.winner,
                "ranking": t.ranking,
                "scores": t.scores,
                "format": t.format,
                "budget": t.budget,
                "verify_calls": t.calls,
                "unparsed": t.unparsed,
                "majority_winner": self.majority.winner,
                "votes": self.majority.votes,
                "pairs_by_key": {k: list(v) for k, v in self.pairs_by_key.items()},
                "comparisons": [
                    {"first": c.first, "second": c.second, "verdict": c.verdict, "round": c.round}
                    for c in t.comparisons
                ],
            },
        }


def prompt_key(messages: Messages | list[Any]) -> str:
    """A short digest of a call's last message text: how credit matches a traced call to its pair."""
    last = messages[-1]
    text = last.get("content") if isinstance(last, dict) else getattr(last, "text", None)
    return hashlib.sha256(str(text or "").encode()).hexdigest()[:16]


async def solve_v1(
    problem: str,
    config: AgentConfig,
    settings: V1Settings | None = None,
    *,
    extract_answer: Callable[[str], str | None] = extract_boxed,
    answer_key: Callable[[str], Hashable] = str.strip,
    generate_messages: Callable[[str], Messages] | None = None,
    verify_messages: Callable[[str, str, str], Messages] = pairwise_messages,
) -> V1Outcome:
    """Generate ``settings.n`` candidates concurrently, rank them by a pairwise tournament.

    ``extract_answer`` finds a candidate's final answer (for the majority-vote baseline and its
    seeding prior); ``verify_messages(problem, first, second)`` builds a verification prompt.
    """
    settings = settings or V1Settings()
    sampling = sampling_kwargs(config)
    gen_messages = generate_messages(problem) if generate_messages else [{"role": "user", "content": problem}]
    async with (
        async_openai(config, role=settings.generate_role) as generator,
        async_openai(config, role=settings.verify_role) as verifier,
    ):

        async def generate(i: int) -> str:
            # With a sampling seed, candidate i samples with seed + i: one seed for all would
            # make the N candidates identical on a seeded sampler. (A gateway session that sets
            # its own seed overrides this; leave the session's seed unset for V1.)
            seeded = {**sampling, "seed": sampling["seed"] + i} if "seed" in sampling else sampling
            reply = await generator.chat.completions.create(
                model=config.model, messages=gen_messages, **seeded
            )
            return reply.choices[0].message.content or ""

        candidates = list(await asyncio.gather(*(generate(i) for i in range(settings.n))))
        answers = [extract_answer(c) for c in candidates]
        majority = majority_vote(answers, key=answer_key, seed=settings.seed)
        keys: dict[str, tuple[int, int]] = {}

        async def verify(first: int, second: int) -> Verdict | None:
            messages = verify_messages(problem, candidates[first], candidates[second])
            keys[prompt_key(messages)] = (first, second)
            reply = await verifier.chat.completions.create(model=config.model, messages=messages, **sampling)
            return parse_verdict(reply.choices[0].message.content or "")

        result = await run_tournament(
            settings.n,
            verify,
            budget=settings.calls,
            format=settings.format,
            both_orders=settings.both_orders,
            prior=[float(v) for v in majority.votes] if settings.seed_by_votes else None,
            seed=settings.seed,
        )
    return V1Outcome(candidates, answers, result, majority, keys)
