"""Engine controls: concurrency limit, streaming by task, validation sampling, auth, self-scored flows."""

from __future__ import annotations

import asyncio

import openai

from rllm.engine.rollout.rollout_config import RolloutConfig
from rllm.engine.rollout.rollout_engine import RolloutEngine
from rllm.engine.rollout.rollout_progress import RolloutProgress
from rllm.gateway import GatewayConfig, GatewayServer
from rllm.sdk import AgentConfig, SamplingParams, Task, rollout, sampling_kwargs
from rllm.types import Episode, SchemaError, TerminationReason, Trajectory, convert


async def ask(config: AgentConfig, content: str = "hi") -> str:
    async with openai.AsyncOpenAI(base_url=config.base_url, api_key=config.api_key, max_retries=0) as client:
        reply = await client.chat.completions.create(
            model=config.model, messages=[{"role": "user", "content": content}], **sampling_kwargs(config)
        )
    return reply.choices[0].message.content


def tasks(n: int) -> list[Task]:
    return [Task(id=f"t{i}", instruction=f"q{i}") for i in range(n)]


async def test_concurrency_limit_is_respected(gateway):
    running = peak = 0
    full = asyncio.Event()  # the first flows wait until the limit is reached, so it is reached

    @rollout
    async def counted(task: Task, config: AgentConfig) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        if running == 3:
            full.set()
        await asyncio.wait_for(full.wait(), 60)
        await ask(config)
        running -= 1

    config = RolloutConfig(n=4, concurrency=3, progress=False)
    async with RolloutEngine(counted, None, config, gateway_url=gateway.url) as engine:
        episodes = await engine.run(tasks(5))
    assert peak == 3 and len(episodes) == 20
    assert engine.last_stats["rollouts"] == 20 and engine.last_stats["success_rate"] == 1.0


async def test_stream_yields_each_task_group_when_complete(gateway):
    others_done = 0
    others = asyncio.Event()  # t0's flows answer only once the other four have

    @rollout
    async def flow(task: Task, config: AgentConfig) -> str:
        nonlocal others_done
        if task.id == "t0":
            await asyncio.wait_for(others.wait(), 60)
            return await ask(config)
        answer = await ask(config)
        others_done += 1
        if others_done == 4:
            others.set()
        return answer

    async with RolloutEngine(
        flow, None, RolloutConfig(n=2, progress=False), gateway_url=gateway.url
    ) as engine:
        order = [[ep.task_id for ep in group] async for group in engine.stream(tasks(3))]
    assert order[-1] == ["t0", "t0"]  # the slow task comes last, its group whole
    assert sorted(order) == [["t0", "t0"], ["t1", "t1"], ["t2", "t2"]]


async def test_validation_runs_use_val_sampling(gateway, upstream):
    @rollout
    async def flow(task: Task, config: AgentConfig) -> str:
        assert config.is_validation == (config.sampling.temperature == 0.0)
        return await ask(config)

    config = RolloutConfig(
        sampling=SamplingParams(temperature=1.0), val_sampling=SamplingParams(temperature=0.0), progress=False
    )
    async with RolloutEngine(flow, None, config, gateway_url=gateway.url) as engine:
        (train,) = await engine.run(tasks(1))
        assert upstream.stats.last_request["temperature"] == 1.0
        (val,) = await engine.run(tasks(1), is_validation=True)
        assert upstream.stats.last_request["temperature"] == 0.0
    assert train.termination_reason == val.termination_reason == TerminationReason.DONE


async def test_attach_to_an_authenticated_gateway(upstream):
    server = GatewayServer(
        GatewayConfig(
            upstreams=[upstream.url], admin_key="admin-secret", session_auth=True, health_interval_s=0
        )
    )
    await server.start()
    try:
        seen_keys: list[str] = []

        @rollout
        async def flow(task: Task, config: AgentConfig) -> str:
            seen_keys.append(config.api_key)
            return await ask(config)

        engine = RolloutEngine(
            flow, None, RolloutConfig(progress=False), gateway_url=server.url, admin_key="admin-secret"
        )
        async with engine:
            episodes = await engine.run(tasks(2))
    finally:
        await server.stop()
    assert all(ep.termination_reason == TerminationReason.DONE for ep in episodes), [
        ep.error for ep in episodes
    ]
    assert len(set(seen_keys)) == 2 and "EMPTY" not in seen_keys  # per-session tokens


async def test_flow_that_scores_itself_keeps_its_rewards_without_an_evaluator(gateway):
    @rollout
    async def self_scored(task: Task, config: AgentConfig) -> Episode:
        await ask(config)
        return Episode(
            task_id=task.id,
            trajectories=[Trajectory(role="default", reward=0.25)],
            termination_reason=TerminationReason.MAX_TURNS,
        )

    async with RolloutEngine(
        self_scored, None, RolloutConfig(progress=False), gateway_url=gateway.url
    ) as engine:
        (ep,) = await engine.run(tasks(1))
    assert ep.termination_reason == TerminationReason.MAX_TURNS
    assert ep.trajectories[0].reward == 0.25 and len(ep.trajectories[0].steps) == 1


def test_rollout_config_rejects_bad_values_naming_the_field():
    for field, value in [("n", 0), ("concurrency", 0), ("deadline_s", -1.0), ("max_retries", -1)]:
        try:
            convert({field: value}, RolloutConfig)
        except SchemaError as exc:
            assert exc.path == field
        else:
            raise AssertionError(f"{field}={value} was accepted")


def test_progress_counts_and_draws_rate_success_and_errors(monkeypatch, capfd):
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # make rich treat the captured stderr as a terminal
    progress = RolloutProgress(3, enabled=True)
    assert progress.enabled
    for reason in (TerminationReason.DONE, TerminationReason.TIMEOUT, TerminationReason.MAX_TURNS):
        progress.update(Episode(task_id="t", termination_reason=reason))
    progress.close()
    drawn = capfd.readouterr().err
    assert "3/3" in drawn and "rollouts/s" in drawn and "errors 1" in drawn and "ok 67%" in drawn
    stats = progress.summary()
    assert stats["rollouts"] == 3 and stats["errors"] == 1 and stats["success_rate"] == 2 / 3


def test_progress_bar_can_be_switched_off():
    assert not RolloutProgress(1, enabled=False).enabled
