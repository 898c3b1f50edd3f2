"""RolloutEngine end to end: real gateway, real loopback upstream, flows using the real openai client."""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
import time

import httpx
import openai
import pytest

from rllm.engine.rollout.rollout_config import RolloutConfig
from rllm.engine.rollout.rollout_engine import RolloutEngine
from rllm.engine.rollout.scoring import apply_eval_output
from rllm.gateway import GatewayConfig
from rllm.sdk import AgentConfig, EvalOutput, Task, evaluator, final_answer, role_url, rollout
from rllm.testing import MockUpstream, wait_until
from rllm.types import Episode, SamplingParams, TerminationReason, Trajectory
from rllm.types.errors import InputError

JUDGE_MARKER = "You are the judge."  # the scripted upstream (conftest) answers it with a verdict


def utf8_ids(text: str) -> list[int]:
    return list(text.encode())


def ids_text(ids) -> str:
    """The mock upstream's token ids are UTF-8 bytes."""
    return bytes(list(ids)).decode()


@rollout
async def single_turn(task: Task, config: AgentConfig) -> dict:
    async with openai.AsyncOpenAI(base_url=config.base_url, api_key=config.api_key, max_retries=0) as client:
        reply = await client.chat.completions.create(
            model=config.model, messages=[{"role": "user", "content": task.instruction}]
        )
    return {"answer": reply.choices[0].message.content}


@evaluator
def contains_four(task: Task, episode) -> bool:
    return "4" in final_answer(episode)


def tasks(n: int) -> list[Task]:
    return [Task(id=f"t{i}", instruction=f"What is 2+2? #{i}", ground_truth="4") for i in range(n)]


async def test_single_turn_builds_steps_with_sampler_tokens(gateway):
    config = RolloutConfig(n=2, concurrency=4, progress=False)
    async with RolloutEngine(single_turn, contains_four, config, gateway_url=gateway.url) as engine:
        episodes = await engine.run(tasks(3))
    assert [(e.task_id, e.rollout_index) for e in episodes] == [
        (f"t{i}", r) for i in range(3) for r in range(2)
    ]
    for ep in episodes:
        assert ep.termination_reason == TerminationReason.DONE, ep.error
        assert ep.is_correct is True
        (traj,) = ep.trajectories
        assert traj.role == "default" and traj.reward == 1.0
        (step,) = traj.steps
        expected = f"The answer is 4. [{ep.task_id[1:]}]"
        assert step.output.text == expected
        assert list(step.completion_ids) == utf8_ids(expected)
        assert len(step.completion_logprobs) == len(step.completion_ids)
        assert all(lp < 0 for lp in step.completion_logprobs)
        # The mock renders "<role>content\n" per message, then "<assistant>".
        assert ids_text(step.prompt_ids) == f"<user>What is 2+2? #{ep.task_id[1:]}\n<assistant>"
        assert step.done and ep.metrics["llm_calls"] == 1.0


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            },
        },
    }
]


@rollout
async def calculator_agent(task: Task, config: AgentConfig) -> None:
    messages: list = [{"role": "user", "content": task.instruction}]
    async with openai.AsyncOpenAI(base_url=config.base_url, api_key=config.api_key, max_retries=0) as client:
        for _ in range(4):
            reply = await client.chat.completions.create(model=config.model, messages=messages, tools=TOOLS)
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                return None
            for call in message.tool_calls:
                args = json.loads(call.function.arguments)
                messages.append(
                    {"role": "tool", "tool_call_id": call.id, "content": str(args["a"] + args["b"])}
                )
    return None


async def test_multi_turn_tool_calls_become_ordered_steps(gateway):
    @evaluator
    def check(task: Task, episode) -> EvalOutput:
        return EvalOutput(reward=float(final_answer(episode) == f"The answer is {task.ground_truth}."))

    rows = [
        Task(id=f"c{i}", instruction=f"use the calculator: {i}+{i * 10}", ground_truth=11 * i)
        for i in range(4)
    ]
    async with RolloutEngine(
        calculator_agent, check, RolloutConfig(progress=False), gateway_url=gateway.url
    ) as engine:
        episodes = await engine.run(rows)
    for ep, task in zip(episodes, rows, strict=True):
        assert ep.termination_reason == TerminationReason.DONE, ep.error
        (traj,) = ep.trajectories
        first, second = traj.steps
        assert first.output.tool_calls[0].function.name == "add"
        assert first.finish_reason == "tool_calls" and second.finish_reason == "stop"
        assert [m.role for m in second.input] == ["user", "assistant", "tool"]
        assert second.output.text == f"The answer is {task.ground_truth}."
        assert list(second.completion_ids) == utf8_ids(second.output.text)
        assert [s.metadata["seq"] for s in traj.steps] == [0, 1]
        assert traj.reward == 1.0 and not first.done and second.done


@rollout
async def solver_and_judge(task: Task, config: AgentConfig) -> dict:
    async with (
        openai.AsyncOpenAI(
            base_url=role_url(config, "solver"), api_key=config.api_key, max_retries=0
        ) as solver,
        openai.AsyncOpenAI(
            base_url=role_url(config, "judge"), api_key=config.api_key, max_retries=0
        ) as judge,
    ):
        answer = await solver.chat.completions.create(
            model=config.model, messages=[{"role": "user", "content": task.instruction}]
        )
        text = answer.choices[0].message.content
        verdict = await judge.chat.completions.create(
            model=config.model, messages=[{"role": "user", "content": f"{JUDGE_MARKER} Grade: {text}"}]
        )
    return {"answer": text, "verdict": verdict.choices[0].message.content}


async def test_solver_and_judge_roles_become_named_trajectories(gateway):
    @evaluator
    def judged(task: Task, episode) -> EvalOutput:
        ok = "VERDICT: CORRECT" in episode.artifacts["verdict"]
        return EvalOutput(reward=1.0 if ok else 0.0, is_correct=ok, trajectory_rewards={"judge": 0.5})

    async with RolloutEngine(
        solver_and_judge, judged, RolloutConfig(n=3, progress=False), gateway_url=gateway.url
    ) as engine:
        episodes = await engine.run(tasks(2))
    for ep in episodes:
        assert ep.termination_reason == TerminationReason.DONE, ep.error
        assert sorted(t.role for t in ep.trajectories) == ["judge", "solver"]
        solver, judge = ep.trajectory("solver"), ep.trajectory("judge")
        assert solver.reward == 1.0 and judge.reward == 0.5 and ep.is_correct
        (s,), (j,) = solver.steps, judge.steps
        assert s.output.text == ep.artifacts["answer"]
        assert list(s.completion_ids) == utf8_ids(ep.artifacts["answer"])
        assert list(j.completion_ids) == utf8_ids("Checked.\nVERDICT: CORRECT")
        assert JUDGE_MARKER in ids_text(j.prompt_ids)
        assert JUDGE_MARKER not in ids_text(s.prompt_ids)


async def test_flow_exception_is_agent_error_with_traceback(gateway):
    @rollout
    async def broken(task: Task, config: AgentConfig) -> None:
        await single_turn(task, config)
        raise KeyError("missing-tool")

    async with RolloutEngine(
        broken, contains_four, RolloutConfig(progress=False), gateway_url=gateway.url
    ) as eng:
        (ep,) = await eng.run(tasks(1))
    assert ep.termination_reason == TerminationReason.AGENT_ERROR
    assert ep.error.type == "KeyError" and "missing-tool" in ep.error.message
    assert "in broken" in ep.error.traceback
    assert ep.metrics["attempts"] == 1.0  # agent errors are not retried
    assert ep.trajectories[0].reward == 0.0 and ep.is_correct is False
    assert len(ep.trajectories[0].steps) == 1  # what it did before crashing is kept


async def test_hung_upstream_past_deadline_is_timeout_and_cancelled():
    release = asyncio.Event()  # the upstream hangs until the test lets it go (so teardown is quick)

    async def hanging(body):
        await release.wait()
        return "too late"

    upstream = await MockUpstream(responder=hanging).start()
    config = RolloutConfig(deadline_s=0.5, progress=False, keep_sessions=True)
    try:
        async with RolloutEngine(single_turn, contains_four, config, upstreams=[upstream.url]) as engine:
            t0 = time.monotonic()
            (ep,) = await engine.run(tasks(1))
            elapsed = time.monotonic() - t0
            (session,) = await engine.client.list_sessions()
            traces = []

            async def traced() -> bool:
                nonlocal traces
                traces = await engine.client.get_traces(session["session_id"])
                return bool(traces)

            # the flow's aborted HTTP call reaches the gateway as a disconnect
            await wait_until(traced, what="the aborted call's trace")
    finally:
        release.set()
        await upstream.stop()
    assert ep.termination_reason == TerminationReason.TIMEOUT
    assert "deadline" in ep.error.message
    assert elapsed < 5
    assert [t.status for t in traces] == ["abort"]


async def test_a_seeded_config_gives_each_rollout_of_a_group_its_own_seed():
    seeds: list[int] = []

    def record(body):
        seeds.append(body["seed"])
        return "4"

    upstream = await MockUpstream(responder=record).start()
    config = RolloutConfig(n=3, progress=False, sampling=SamplingParams(seed=5))
    try:
        async with RolloutEngine(single_turn, contains_four, config, upstreams=[upstream.url]) as engine:
            await engine.run(tasks(2))
            first = sorted(seeds)
            seeds.clear()
            await engine.run(tasks(2))  # the same rollouts again: the same seeds
    finally:
        await upstream.stop()
    assert len(set(first)) == 6  # 2 tasks x 3 rollouts, no two alike
    assert sorted(seeds) == first


async def test_each_drawing_of_a_task_in_one_batch_samples_with_seeds_of_its_own():
    """A step that draws a task more than once (tasks_per_step above the split's size, dynamic
    sampling's extra groups) must get new samples from each drawing: with one seed per (task,
    rollout index) every drawing repeated the first one's text, rollout for rollout. A later
    round continues the count (``drawings``); the first drawing keeps the seeds it always had."""
    seeds: list[int] = []

    def record(body):
        seeds.append(body["seed"])
        return "4"

    upstream = await MockUpstream(responder=record).start()
    config = RolloutConfig(n=2, progress=False, sampling=SamplingParams(seed=5))
    (task,) = tasks(1)
    try:
        async with RolloutEngine(single_turn, contains_four, config, upstreams=[upstream.url]) as engine:
            await engine.run([task])
            once = sorted(seeds)
            seeds.clear()
            await engine.run([task, task, task])  # one batch, three drawings
            batch = list(seeds)
            seeds.clear()
            await engine.run([task], drawings=[3])  # a later round: the fourth drawing
            later = list(seeds)
            seeds.clear()
            await engine.run([task], drawings=[1])  # the second drawing again: its seeds again
            again = list(seeds)
    finally:
        await upstream.stop()
    assert len(set(batch)) == 6 and set(once) <= set(batch)
    assert len(set(later)) == 2 and not set(later) & set(batch)
    assert set(again) <= set(batch) and not set(again) & set(once)
    with pytest.raises(InputError, match="drawings: 2 numbers for 1 tasks"):
        async with RolloutEngine(single_turn, contains_four, config, upstreams=[upstream.url]) as engine:
            await engine.run([task], drawings=[0, 1])


async def test_timed_out_rollout_releases_its_session(gateway, upstream):
    @rollout
    async def sleeper(task: Task, config: AgentConfig) -> None:
        await single_turn(task, config)
        await asyncio.Event().wait()  # never set: only the deadline ends this rollout

    # Long enough for the first call on a cold, busy machine (the openai client's first use alone
    # blocks for a fraction of a second while it imports its resources).
    config = RolloutConfig(deadline_s=5.0, progress=False)
    async with RolloutEngine(sleeper, contains_four, config, gateway_url=gateway.url) as engine:
        episodes = await engine.run(tasks(3))
        assert await engine.client.list_sessions() == []
    for ep in episodes:
        assert ep.termination_reason == TerminationReason.TIMEOUT
        assert len(ep.trajectories[0].steps) == 1  # the call made before the deadline is kept


async def test_sync_flow_past_deadline_times_out_and_later_calls_fail_fast(gateway):
    done_calls: list[str] = []
    timed_out = threading.Event()  # the flow's thread calls only after the engine gave up on it
    called = threading.Event()

    @rollout
    def slow_sync(task: Task, config: AgentConfig) -> str:
        timed_out.wait(60)
        client = openai.OpenAI(base_url=config.base_url, api_key=config.api_key, max_retries=0)
        try:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "late"}])
            done_calls.append("ok")
        except openai.APIStatusError as exc:
            done_calls.append(str(exc.status_code))
        finally:
            called.set()
        return "late"

    config = RolloutConfig(deadline_s=0.3, progress=False)
    async with RolloutEngine(slow_sync, contains_four, config, gateway_url=gateway.url) as engine:
        try:
            (ep,) = await engine.run(tasks(1))
        finally:
            timed_out.set()
        assert ep.termination_reason == TerminationReason.TIMEOUT
        assert await asyncio.to_thread(called.wait, 60), "the abandoned thread never made its call"
    assert done_calls == ["410"]  # the ended session refuses the abandoned thread's call


async def test_upstream_dying_mid_run_is_retried_on_a_fresh_session(gateway, upstream):
    # The gateway itself retries one dropped connection; a second drop reaches the engine.
    upstream.fail("die", count=2)
    config = RolloutConfig(max_retries=2, retry_backoff_s=0.3, progress=False)
    async with RolloutEngine(calculator_agent, contains_four, config, gateway_url=gateway.url) as engine:
        (ep,) = await engine.run([Task(id="x", instruction="use the calculator: 1+3")])
    assert ep.termination_reason == TerminationReason.DONE, ep.error
    assert ep.metrics["attempts"] == 2.0 and len(ep.metadata["retried"]) == 1
    (traj,) = ep.trajectories
    assert len(traj.steps) == 2 and "dropped_traces" not in traj.metadata  # old session's traces discarded
    assert ep.is_correct


async def test_upstream_dead_for_good_ends_as_infra_error(gateway, upstream):
    upstream.fail("status", status=500)
    config = RolloutConfig(max_retries=1, retry_backoff_s=0.0, progress=False)
    async with RolloutEngine(single_turn, contains_four, config, gateway_url=gateway.url) as engine:
        episodes = await engine.run(tasks(3))
    for ep in episodes:
        assert ep.termination_reason == TerminationReason.INFRA_ERROR
        assert ep.metrics["attempts"] == 2.0
        assert ep.error.type == "InternalServerError"


async def test_evaluator_exception_gives_zero_reward_and_records_error(gateway):
    @evaluator
    def crashing(task: Task, episode) -> float:
        raise ZeroDivisionError("bad grader")

    async with RolloutEngine(
        single_turn, crashing, RolloutConfig(progress=False), gateway_url=gateway.url
    ) as eng:
        (ep,) = await eng.run(tasks(1))
    assert ep.termination_reason == TerminationReason.DONE
    assert ep.trajectories[0].reward == 0.0 and ep.is_correct is False
    assert ep.metadata["eval_error"]["type"] == "ZeroDivisionError"


async def test_engine_starts_its_own_gateway(upstream):
    engine = RolloutEngine(
        single_turn, contains_four, RolloutConfig(progress=False), upstreams=[upstream.url]
    )
    async with engine:
        assert engine.gateway_url.startswith("http://127.0.0.1:")
        episodes = await engine.run(tasks(2), n=2)
    assert all(ep.is_correct for ep in episodes) and len(episodes) == 4


async def test_500_concurrent_rollouts_no_lost_or_misattributed_trace():
    upstream = MockUpstream(latency=0.05, responder=lambda body: "echo:" + body["messages"][-1]["content"])
    await upstream.start()
    # Each rollout has its own small connection pool (httpx's pool scans all its connections per
    # request, so one huge shared pool is quadratic); the TLS context, costly to build, is shared.
    tls = ssl.create_default_context()

    @rollout
    async def two_roles(task: Task, config: AgentConfig) -> None:
        async with httpx.AsyncClient(verify=tls, timeout=120) as http:
            main = openai.AsyncOpenAI(base_url=config.base_url, api_key="k", max_retries=0, http_client=http)
            for turn in range(2):
                await main.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": f"{config.session_id}|{task.id}|{turn}"}]
                )
            critic_url = role_url(config, "critic")
            critic = openai.AsyncOpenAI(base_url=critic_url, api_key="k", max_retries=0, http_client=http)
            await critic.chat.completions.create(
                model="m", messages=[{"role": "user", "content": f"{task.id}|critic"}]
            )

    try:
        # No retries, so any lost call shows. Health probes off: in this one saturated process a
        # probe can time out and eject the only worker (reported to the gateway's owner).
        config = RolloutConfig(n=5, concurrency=500, progress=False, max_retries=0)
        gateway_config = GatewayConfig(
            upstreams=[upstream.url], auto_create_sessions=False, health_interval_s=0
        )
        async with RolloutEngine(two_roles, None, config, gateway_config=gateway_config) as engine:
            episodes = await engine.run([Task(id=f"q{i}", instruction="") for i in range(100)])
    finally:
        await upstream.stop()
    assert len(episodes) == 500
    assert len({ep.id for ep in episodes}) == 500
    assert sorted((ep.task_id, ep.rollout_index) for ep in episodes) == sorted(
        (f"q{i}", r) for i in range(100) for r in range(5)
    )
    session_ids = set()
    for ep in episodes:
        assert ep.termination_reason == TerminationReason.DONE, ep.error
        main, critic = ep.trajectory("default"), ep.trajectory("critic")
        assert len(main.steps) == 2 and len(critic.steps) == 1
        sids = {s.input[0].text.split("|")[0] for s in main.steps}
        assert len(sids) == 1  # both turns came from this rollout's own session
        session_ids |= sids
        assert [s.output.text.split("|")[1:] for s in main.steps] == [[ep.task_id, "0"], [ep.task_id, "1"]]
        assert critic.steps[0].output.text == f"echo:{ep.task_id}|critic"
        for s in (*main.steps, *critic.steps):
            assert ids_text(s.completion_ids) == s.output.text
    assert len(session_ids) == 500


@pytest.mark.parametrize("bad", [42, object()])
async def test_flow_returning_unsupported_type_is_agent_error(gateway, bad):
    @rollout
    def returns_bad(task: Task, config: AgentConfig):
        return bad

    async with RolloutEngine(
        returns_bad, None, RolloutConfig(progress=False), gateway_url=gateway.url
    ) as eng:
        (ep,) = await eng.run(tasks(1))
    assert ep.termination_reason == TerminationReason.AGENT_ERROR
    assert ep.error.type == "FlowReturnError"


def test_trajectory_rewards_by_id_win_over_the_role_name():
    a, b, judge = Trajectory(role="gen"), Trajectory(role="gen"), Trajectory(role="judge")
    episode = Episode(task_id="t", trajectories=[a, b, judge])
    apply_eval_output(episode, EvalOutput(reward=0.25, trajectory_rewards={a.id: 1.0, "gen": 0.5}))
    assert (a.reward, b.reward, judge.reward) == (1.0, 0.5, 0.25)
