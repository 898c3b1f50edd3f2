"""Rubric and group judges against a real loopback OpenAI-compatible server (rllm.testing's
MockUpstream, a named fake model) through the real ``openai`` client: scores, the reply cache in
memory and in SQLite, token accounting, the concurrency limit, refused replies recorded as
infrastructure errors, a judge endpoint that is down, and a judge combined with a programmatic
reward."""

from __future__ import annotations

import asyncio
import re
import socket
import threading
from pathlib import Path

import pytest

from rllm.sdk.evaluator import evaluator
from rllm.sdk.rewards import (
    CombinedReward,
    GroupGather,
    GroupJudge,
    JudgeCache,
    JudgeEndpoint,
    JudgeUnavailable,
    RubricJudge,
    exact_match,
)
from rllm.testing import MockUpstream
from rllm.types import Episode, Message, Step, Task, TerminationReason, Trajectory

pytest.importorskip("openai")

TASK = Task(id="t", instruction="Name a fruit.", ground_truth="apple")


def episode(answer: str, index: int = 0) -> Episode:
    step = Step(output=Message(role="assistant", content=answer))
    return Episode(task_id="t", rollout_index=index, trajectories=[Trajectory(steps=[step])])


def signals(output) -> dict[str, float]:
    return {s.name: s.value for s in output.signals}


def grade_each_reply(body: dict) -> str:
    """The scripted judge: 10 for a reply naming apple, 2 otherwise, in the group format."""
    prompt = body["messages"][-1]["content"]
    blocks = re.findall(r"Reply (\d+):\n(.*?)\n", prompt)
    if blocks:
        return "\n".join(f"SCORE {i}: {10 if 'apple' in text else 2}" for i, text in blocks)
    return "Looks right.\nSCORE: 10" if "apple" in prompt.split("Reply to grade:")[1] else "SCORE: 2"


async def test_a_rubric_judge_scores_caches_and_counts_its_tokens(tmp_path: Path) -> None:
    async with MockUpstream(responder=grade_each_reply) as server:
        endpoint = JudgeEndpoint(server.url, "mock-model", price_per_mtok=(1.0, 2.0), cache=tmp_path / "c.db")
        judge = RubricJudge(endpoint, "Names a fruit.", correct_at=0.5)
        good = await judge.evaluate(TASK, episode("an apple"))
        bad = await judge.evaluate(TASK, episode("a car"))
        again = await judge.evaluate(TASK, episode("an apple"))
        asked = server.stats.by_path.get("/v1/chat/completions")
        # A second process opening the same cache file answers without asking the model.
        other = RubricJudge(
            JudgeEndpoint(server.url, "mock-model", cache=tmp_path / "c.db"), "Names a fruit."
        )
        from_file = await other.evaluate(TASK, episode("an apple"))
        await endpoint.aclose()
        assert server.stats.by_path.get("/v1/chat/completions") == asked == 2
    assert (good.reward, good.is_correct, bad.reward, bad.is_correct) == (1.0, True, 0.2, False)
    first = signals(good)
    assert first["judge/calls"] == 1 and first["judge/cache_hits"] == 0
    assert first["judge/prompt_tokens"] > 0 and first["judge/completion_tokens"] > 0
    expected_cost = (first["judge/prompt_tokens"] * 1.0 + first["judge/completion_tokens"] * 2.0) / 1e6
    assert first["judge/cost_usd"] == pytest.approx(expected_cost)
    assert signals(again)["judge/cache_hits"] == 1 and signals(again)["judge/calls"] == 0
    assert again.reward == 1.0 and from_file.reward == 1.0 and signals(from_file)["judge/cache_hits"] == 1
    totals = endpoint.usage.as_dict()
    assert (
        totals["calls"] == 2
        and totals["cache_hits"] == 1
        and totals["cache_hit_rate"] == pytest.approx(1 / 3)
    )
    assert len(JudgeCache(tmp_path / "c.db")) == 2


async def test_an_unparseable_reply_is_an_infra_error_with_the_reply_never_a_score() -> None:
    async with MockUpstream(responder=lambda body: "I would say it is quite good overall") as server:
        judge = RubricJudge(JudgeEndpoint(server.url, "mock-model"), "Names a fruit.")
        ep = episode("an apple")
        output = await judge.evaluate(TASK, ep)
        await judge.evaluate(TASK, episode("an apple"))
        # Refused replies are not cached: the judge is asked again.
        assert server.stats.by_path["/v1/chat/completions"] == 2
    assert ep.termination_reason == TerminationReason.INFRA_ERROR
    assert ep.error is not None and "quite good overall" in ep.error.message and "SCORE" in ep.error.message
    assert output.metadata["judge_error"]["reply"] == "I would say it is quite good overall"
    assert signals(output)["judge/failed"] == 1 and output.is_correct is None
    assert judge.endpoint.usage.refused == 2


async def test_the_group_judge_asks_once_per_group_and_shares_the_cost() -> None:
    async with MockUpstream(responder=grade_each_reply) as server:
        judge = GroupJudge(JudgeEndpoint(server.url, "mock-model"), "Names a fruit.")
        gather = GroupGather(judge, group_size=3)
        group = [episode("apple pie", 0), episode("a car", 1), episode("an apple", 2)]
        outputs = await asyncio.gather(*(gather.evaluate(TASK, e) for e in group))
        assert server.stats.by_path["/v1/chat/completions"] == 1
    assert [o.reward for o in outputs] == [1.0, 0.2, 1.0]
    assert sum(signals(o)["judge/calls"] for o in outputs) == pytest.approx(1.0)
    assert all(signals(o)["judge/group_size"] == 3 for o in outputs)
    assert gather.partial_groups == 0 and not gather._open


async def test_a_group_short_of_a_member_is_scored_as_it_is_after_the_gather_timeout() -> None:
    """The third rollout never reaches the evaluator (it failed): the two that did are judged."""
    async with MockUpstream(responder=grade_each_reply) as server:
        gather = GroupGather(
            GroupJudge(JudgeEndpoint(server.url, "mock-model"), "r"), 3, gather_timeout_s=0.3
        )
        outputs = await asyncio.gather(
            *(gather.evaluate(TASK, e) for e in [episode("apple", 0), episode("x", 1)])
        )
    assert [o.reward for o in outputs] == [1.0, 0.2]
    assert all(signals(o)["judge/partial_group"] == 1 for o in outputs) and gather.partial_groups == 1


async def test_a_refused_group_reply_fails_every_member() -> None:
    async with MockUpstream(responder=lambda body: "SCORE 1: 9") as server:  # trajectory 2 unscored
        gather = GroupGather(GroupJudge(JudgeEndpoint(server.url, "mock-model"), "r"), 2)
        group = [episode("apple", 0), episode("pear", 1)]
        await asyncio.gather(*(gather.evaluate(TASK, e) for e in group))
    assert all(e.termination_reason == TerminationReason.INFRA_ERROR for e in group)
    assert all("no 'SCORE i: s' line for trajectory 2" in (e.error.message if e.error else "") for e in group)


async def test_no_more_calls_in_flight_than_the_limit() -> None:
    """Six groups at once through a limit of two: the judge sees two, never more (and without
    the limit it would see six). Each call is held until a second one is in flight."""
    lock = threading.Lock()
    state = {"now": 0, "most": 0}
    second_in: list[asyncio.Event] = []

    async def responder(body: dict) -> str:
        if not second_in:
            second_in.append(asyncio.Event())  # made on the server's own loop
        with lock:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
            if state["now"] >= 2:
                second_in[0].set()
        await second_in[0].wait()
        with lock:
            state["now"] -= 1
        return grade_each_reply(body)

    async with MockUpstream(responder=responder) as server:
        judge = GroupJudge(JudgeEndpoint(server.url, "mock-model", max_concurrency=2), "r")
        tasks = [Task(id=f"t{i}", instruction=f"Name fruit {i}.") for i in range(6)]
        await asyncio.gather(*(judge.score_group(t, [episode("apple")]) for t in tasks))
    assert state["most"] == 2


def test_a_judge_endpoint_that_is_down_or_lacks_the_model_is_refused_before_anything_runs() -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(JudgeUnavailable, match="unreachable"):
        JudgeEndpoint(f"http://127.0.0.1:{port}/v1", "judge").check(timeout_s=5)

    async def wrong_model() -> None:
        async with MockUpstream(model="served-model") as server:
            await asyncio.to_thread(JudgeEndpoint(server.url, "served-model").check)
            with pytest.raises(JudgeUnavailable, match=r"does not serve model 'other'.*served-model"):
                await asyncio.to_thread(JudgeEndpoint(server.url, "other").check)

    asyncio.run(wrong_model())


async def test_a_judge_combined_with_a_programmatic_reward() -> None:
    @evaluator
    def exact(task: Task, ep: Episode) -> bool:
        return exact_match(ep.trajectories[0].steps[0].output.text, str(task.ground_truth))

    async with MockUpstream(responder=grade_each_reply) as server:
        judge = RubricJudge(JudgeEndpoint(server.url, "mock-model"), "Names a fruit.")
        combined = CombinedReward([("exact", exact, 0.5), ("judge", judge, 0.5)], correct_from="exact")
        right = await combined.evaluate(TASK, episode("apple"))
        near = await combined.evaluate(TASK, episode("an apple"))
    async with MockUpstream(responder=lambda body: "no idea") as server:
        broken = CombinedReward(
            [("exact", exact, 1.0), ("judge", RubricJudge(JudgeEndpoint(server.url, "m"), "r"), 1.0)]
        )
        failed_episode = episode("apple")
        failed = await broken.evaluate(TASK, failed_episode)
    assert (right.reward, right.is_correct) == (1.0, True)
    assert (near.reward, near.is_correct) == (0.5, False)
    assert signals(near)["reward/exact"] == 0.0 and signals(near)["reward/judge"] == 1.0
    assert failed_episode.termination_reason == TerminationReason.INFRA_ERROR
    assert failed.metadata["failed_part"] == "judge" and "judge_error" in failed.metadata
