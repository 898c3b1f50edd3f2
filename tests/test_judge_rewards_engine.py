"""The judges under rLLM's rollout engine (a real gateway, rllm.testing's MockUpstream as both the
policy and the judge model): a group judge scores each task's group in one call with relative
rewards, and a judge reply out of format ends as an `infra_error` episode carrying the judge's
reply (never a reward the agent earned), also when the evaluator runs in flow worker processes."""

from __future__ import annotations

import re
from typing import Any

from rllm_cookbook_judge_say import judge_say_flow

from rllm.engine.rollout.rollout_config import RolloutConfig
from rllm.engine.rollout.rollout_engine import RolloutEngine
from rllm.sdk.rewards import GroupGather, GroupJudge, JudgeEndpoint, RubricJudge
from rllm.testing import MockUpstream
from rllm.types import SamplingParams, Task, TerminationReason

TASKS = [Task(id=w, instruction=f"say: {w}", ground_truth=w) for w in ("apple", "river")]


# An importable flow (worker processes import it by name): the judge-say cookbook's.
say_flow = judge_say_flow


def policy(body: dict[str, Any]) -> str:
    """Says the word on rollout... every other call: the group gets a right and a wrong reply."""
    policy.calls += 1  # type: ignore[attr-defined]
    word = body["messages"][-1]["content"].split()[-1]
    return word if policy.calls % 2 else "banana"  # type: ignore[attr-defined]


def group_judge(body: dict[str, Any]) -> str:
    blocks = re.findall(r"Reply (\d+):\n(.*?)\n", body["messages"][-1]["content"])
    return " ".join(f"SCORE {i}: {9 if text != 'banana' else 1}" for i, text in blocks)


def config(**kw: Any) -> RolloutConfig:
    return RolloutConfig(
        n=2, concurrency=8, progress=False, max_retries=0, sampling=SamplingParams(max_tokens=8), **kw
    )


async def test_a_group_judge_scores_each_group_once_under_the_engine() -> None:
    policy.calls = 0  # type: ignore[attr-defined]
    async with MockUpstream(responder=policy) as model, MockUpstream(responder=group_judge) as judge:
        endpoint = JudgeEndpoint(judge.url, "mock-model")
        evaluator = GroupGather(GroupJudge(endpoint, "Says the word."), group_size=2)
        async with RolloutEngine(say_flow, evaluator, config(), upstreams=[model.url]) as engine:
            episodes = await engine.run(TASKS)
        assert judge.stats.by_path["/v1/chat/completions"] == 2  # one call per group
    for pair in (episodes[:2], episodes[2:]):
        assert sorted(e.metrics["reward"] for e in pair) == [0.1, 0.9]
        assert all(e.termination_reason == TerminationReason.DONE for e in pair)
    assert sum(e.metrics["signal/judge/calls"] for e in episodes) == 2.0


async def test_an_unparseable_judge_reply_is_an_infra_error_with_the_reply_in_worker_processes() -> None:
    async with (
        MockUpstream(responder=lambda body: "apple") as model,
        MockUpstream(responder=lambda body: "It looks fine to me.") as judge,
    ):
        evaluator = RubricJudge(JudgeEndpoint(judge.url, "mock-model"), "Says the word.")
        async with RolloutEngine(
            say_flow, evaluator, config(workers=2, executor="processes"), upstreams=[model.url]
        ) as engine:
            episodes = await engine.run(TASKS)
    assert len(episodes) == 4
    for episode in episodes:
        assert episode.termination_reason == TerminationReason.INFRA_ERROR
        assert episode.error is not None and "It looks fine to me." in episode.error.message
        assert episode.metadata["eval"]["judge_error"]["reply"] == "It looks fine to me."
        assert episode.metrics["signal/judge/failed"] == 1.0
