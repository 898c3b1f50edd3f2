"""V1 math end to end: the cookbook's flow against a scripted model on loopback, then training.

The scripted model (MockUpstream: a real OpenAI-compatible HTTP server; the flow uses the real
openai client through a real gateway) writes four candidates per problem, one correct; on
"agree" problems two wrong ones share an answer, so majority vote is always wrong. As a verifier
it judges a mixed pair correctly with probability P and, on "biased" problems, first says "A"
with probability BIAS whatever it is shown. Verdicts are a hash of the prompt and each task fixes
the tournament's seed, so every episode replays through ``run_tournament`` to the same winner;
only the order the N concurrent candidates arrive in may vary, so rates are compared with the
pure tournament's rate against the same verifier within five standard deviations.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import random
import re
from pathlib import Path
from typing import Any

import pytest
from rllm_cookbook_v1_math import v1_math_evaluator, v1_math_flow

from rllm.algos import AlgorithmConfig, filter_groups, group_trajectories
from rllm.engine.evaluation import evaluate
from rllm.engine.training.launch import build_trainer
from rllm.engine.training.metrics_log import read_metrics
from rllm.sdk.v1 import (
    NO_SIGNAL_SUFFIX,
    Verdict,
    majority_vote,
    pairwise_messages,
    parse_verdict,
    run_tournament,
)
from rllm.testing import MockUpstream
from rllm.types import Episode, Task, from_json

P, BIAS, PER_KIND = 0.8, 0.5, 40
KINDS = ("fair", "biased", "agree")
V1 = {"n": 4, "budget": 6, "format": "knockout", "both_orders": True}
REPLY_STYLES = ("Checked both.\nVERDICT: {}", "So the answer is \\boxed{{{}}}", "**{}**")
BOXED = re.compile(r"\\boxed\{(\d+)\}")


def unit(*parts: str) -> float:
    digest = hashlib.sha256("|".join(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def answers_for(task_num: int, kind: str) -> list[int]:
    """Candidate i's answer: one right (at a task-dependent index), three wrong."""
    right = 7 * task_num
    wrong = [right + 1, right + 1, right + 2] if kind == "agree" else [right + 1, right + 2, right + 3]
    at = task_num % 4
    return [*wrong[:at], right, *wrong[at:]]


def parse_problem(problem: str) -> tuple[int, str]:
    match = re.search(r"A (\w+) problem (\d+)", problem)
    return int(match.group(2)), match.group(1)


def verdict_for(prompt: str, problem: str, first: int, second: int) -> str:
    """The scripted verifier: a deterministic function of the prompt."""
    num, kind = parse_problem(problem)
    if kind == "biased" and unit(prompt, "bias") < BIAS:
        return "A"
    good = 7 * num
    if (first == good) == (second == good):
        return "TIE"
    right, wrong = ("A", "B") if first == good else ("B", "A")
    return right if unit(prompt, "accuracy") < P else wrong


class ScriptedModel:
    def __init__(self) -> None:
        self.verifications = 0
        self.generated: dict[str, int] = {}

    def __call__(self, body: dict[str, Any]) -> str:
        prompt = body["messages"][-1]["content"]
        if "## Solution A" not in prompt:
            num, kind = parse_problem(prompt)
            i = self.generated[prompt] = self.generated.get(prompt, -1) + 1
            return f"Working it out ({i}).\nThe answer is \\boxed{{{answers_for(num, kind)[i]}}}"
        self.verifications += 1
        problem = prompt.split("## Problem\n", 1)[1].split("\n\n## Solution A", 1)[0]
        first, second = (int(BOXED.search(s).group(1)) for s in prompt.split("## Solution B"))
        style = REPLY_STYLES[int(unit(prompt, "style") * 3)]
        return style.format(verdict_for(prompt, problem, first, second))


def tasks() -> list[Task]:
    out = []
    for j, kind in enumerate(KINDS):
        for num in range(j * PER_KIND, (j + 1) * PER_KIND):
            problem = f"A {kind} problem {num}: what is {num} times 7?"
            meta = {"v1": {**V1, "seed": num}}
            out.append(
                Task(id=f"{kind}-{num}", instruction=problem, ground_truth=str(7 * num), metadata=meta)
            )
    return out


async def pure_rate(kind: str, trials: int = 4000) -> float:
    """The winner's accuracy of the same tournament against the same verifier, without HTTP."""

    async def run_all() -> float:
        rng = random.Random(7)
        hits = 0
        for t in range(trials):
            answers = answers_for(rng.randrange(10_000), kind)
            good = min(answers)  # the right answer is the smallest

            async def verify(a: int, b: int, answers: list[int] = answers, good: int = good) -> Verdict:
                if kind == "biased" and rng.random() < BIAS:
                    return Verdict.A
                if (answers[a] == good) == (answers[b] == good):
                    return Verdict.TIE
                right = Verdict.A if answers[a] == good else Verdict.B
                return right if rng.random() < P else (Verdict.B if right is Verdict.A else Verdict.A)

            prior = [float(v) for v in majority_vote([str(a) for a in answers], seed=t).votes]
            result = await run_tournament(4, verify, budget=6, format="knockout", prior=prior, seed=t)
            hits += answers[result.winner] == good
        return hits / trials

    return await run_all()


async def replay(episode: dict[str, Any], problem: str) -> int:
    """The winner run_tournament picks for this episode's candidates, seed and scripted verdicts."""
    v1 = episode["artifacts"]["v1"]
    answers = [int(BOXED.search(c).group(1)) for c in v1["candidates"]]

    async def verify(a: int, b: int) -> Verdict:
        prompt = pairwise_messages(problem, v1["candidates"][a], v1["candidates"][b])[0]["content"]
        return Verdict(verdict_for(prompt, problem, answers[a], answers[b]))

    num, _ = parse_problem(problem)
    result = await run_tournament(4, verify, budget=6, format="knockout", prior=v1["votes"], seed=num)
    return result.winner


def expected_verify_reward(step_prompt: str, reply: str, good: str) -> float | None:
    first, second = (re.search(r"\\boxed\{(\d+)\}", s).group(1) for s in step_prompt.split("## Solution B"))
    if (first == good) == (second == good):
        return None
    return float(parse_verdict(reply) is (Verdict.A if first == good else Verdict.B))


async def test_v1_math_eval_finds_the_correct_candidate_and_rewards_both_roles(tmp_path: Path) -> None:
    model = ScriptedModel()
    upstream = MockUpstream(responder=model)
    await upstream.start()
    try:
        summary = await evaluate(
            tasks(),
            v1_math_flow,
            v1_math_evaluator,
            upstream.url,
            output_dir=tmp_path,
            concurrency=16,
            progress=False,
        )
    finally:
        await upstream.stop()
    episodes = [json.loads(line) for line in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    total = len(KINDS) * PER_KIND
    assert summary.num_tasks == total and summary.termination == {"done": total}
    problems = {t.id: t.instruction for t in tasks()}

    # Budget: never more than 6 calls, and the model saw exactly the calls the flows reported.
    calls = [ep["artifacts"]["v1"]["verify_calls"] for ep in episodes]
    assert max(calls) <= V1["budget"] and sum(calls) == model.verifications == total * 6

    # The flow's winner is the pure tournament's winner for the same candidates, seed and verdicts.
    for ep in episodes:
        assert ep["artifacts"]["v1"]["winner"] == await replay(ep, problems[ep["task_id"]])

    # Rates match the pure tournament's against the same verifier (5 standard deviations).
    for kind in KINDS:
        mine = [ep for ep in episodes if ep["task_id"].startswith(kind)]
        rate, expected = sum(ep["is_correct"] for ep in mine) / len(mine), await pure_rate(kind)
        print(kind, rate, expected)
        assert abs(rate - expected) <= 5 * math.sqrt(expected * (1 - expected) / len(mine)), (
            kind,
            rate,
            expected,
        )
        assert expected > 0.25 + 0.1  # and the tournament beats a random pick by a margin
    agree = [ep for ep in episodes if ep["task_id"].startswith("agree")]
    assert all(ep["metadata"]["eval"] and ep["metrics"]["signal/v1/majority_correct"] == 0.0 for ep in agree)
    signals = summary.signals
    assert signals["v1/random_correct"] == 0.25 and signals["v1/pass_at_n"] == 1.0
    assert signals["v1/verify_calls"] == 6.0 and signals["v1/winner_correct"] == summary.accuracy

    # Rewards: each generation call by its candidate, each verification call by its verdict.
    for ep in episodes:
        good = str(int(ep["task_id"].split("-")[1]) * 7)
        gen = [t for t in ep["trajectories"] if t["role"] == "generate"]
        assert sorted(t["reward"] for t in gen) == [0.0, 0.0, 0.0, 1.0]
        for t in gen:
            (step,) = t["steps"]
            assert t["reward"] == float(f"\\boxed{{{good}}}" in step["output"]["content"])
        verify = [t for t in ep["trajectories"] if t["role"].startswith("verify")]
        assert len(verify) == 6
        for t in verify:
            (step,) = t["steps"]
            want = expected_verify_reward(step["input"][-1]["content"], step["output"]["content"], good)
            if want is None:
                assert t["role"] == "verify" + NO_SIGNAL_SUFFIX and t["reward"] == 0.0
            else:
                assert t["role"] == "verify" and t["reward"] == want

    # The filter drops every no-signal group and keeps the candidates' groups (their rewards differ).
    lines = (tmp_path / "episodes.jsonl").read_bytes().splitlines()
    groups = group_trajectories([from_json(line, Episode) for line in lines])
    kept, _ = filter_groups(
        groups,
        AlgorithmConfig(estimator_by_role={"generate": "grpo", "verify": "grpo"}, filter_zero_variance=True),
    )
    names = {g.role for g in kept}
    assert "verify" + NO_SIGNAL_SUFFIX not in names and "generate" in names
    assert all(len(g.trajectories) == 4 for g in kept if g.role == "generate")


@pytest.mark.slow
def test_v1_math_trains_both_roles_for_two_steps(tmp_path: Path) -> None:
    trainer = build_trainer(
        "v1-math",
        out_dir=str(tmp_path),
        overrides=[
            "progress=false",
            "plot=false",
            "tensorboard=false",
            "total_steps=2",
            "val_every=0",
            "tasks_per_step=2",
            "group_size=2",
            "rollout.sampling.max_tokens=6",
            "algorithm.filter_zero_variance=false",
            "backend.options.model=tiny",
        ],
    )
    assert trainer.config.algorithm.estimator_by_role == {"generate": "grpo", "verify": "grpo"}
    asyncio.run(trainer.fit())
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert len(rows) == 2
    # 4 candidates + 6 verification calls per episode, each its own trajectory and sequence.
    assert all(row["train/sequences"] == 10 * row["episodes"] for row in rows), rows
    assert "advantage/generate/mean" in rows[-1]
    assert all(0.0 <= row["signal/v1/winner_correct"] <= row["signal/v1/pass_at_n"] <= 1.0 for row in rows)
    assert all(row["signal/v1/verify_calls"] == 6.0 for row in rows)
