"""Rollout deadlines stand still while the engine's own gateway holds calls at its door (a weight
sync, or the train step a prefetched rollout waits for): rllm.engine.rollout.flow_runner.DeadlineClock."""

from __future__ import annotations

import asyncio

import openai

from rllm.engine.rollout.flow_runner import DeadlineClock, DeadlineExceeded, call_with_deadline
from rllm.engine.rollout.rollout_config import RolloutConfig
from rllm.engine.rollout.rollout_engine import RolloutEngine
from rllm.gateway import GatewayConfig
from rllm.gateway.calls import CallLedger
from rllm.sdk import AgentConfig, Task, rollout, sampling_kwargs
from rllm.types import TerminationReason


async def test_a_held_clock_stops_and_restarts_each_deadline() -> None:
    clock = DeadlineClock()
    started, release = asyncio.Event(), asyncio.Event()

    async def flow() -> str:
        started.set()
        await release.wait()
        return "ok"

    run = asyncio.create_task(
        call_with_deadline(flow, (), is_async=True, deadline_s=1000.0, executor=None, clock=clock)
    )
    await started.wait()
    (fires,) = clock.pending()
    assert fires is not None and fires > asyncio.get_running_loop().time()
    clock.hold(True)
    assert clock.pending() == [None]
    clock.hold(False)
    (again,) = clock.pending()
    assert again is not None and again >= fires  # what it had left, from the release on
    release.set()
    assert await run == "ok"
    assert clock.pending() == []  # an ended call is no longer tracked


async def test_time_held_does_not_count_against_a_deadline() -> None:
    clock = DeadlineClock()
    clock.hold(True)
    started, release, never = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def flow() -> str:
        started.set()
        await release.wait()
        return "ok"

    async def stuck() -> None:
        await never.wait()

    run = asyncio.create_task(
        call_with_deadline(flow, (), is_async=True, deadline_s=0.01, executor=None, clock=clock)
    )
    await started.wait()
    assert clock.pending() == [None]  # started while held: its deadline has not started
    # A witness: an unheld deadline five times as long fires, so the held one's time has passed.
    try:
        await call_with_deadline(stuck, (), is_async=True, deadline_s=0.05, executor=None)
    except DeadlineExceeded:
        pass
    else:
        raise AssertionError("the witness deadline did not fire")
    assert not run.done()  # held: still running, not timed out
    release.set()
    assert await run == "ok"
    # Released, the same deadline fires as before.
    clock.hold(False)
    try:
        await call_with_deadline(stuck, (), is_async=True, deadline_s=0.01, executor=None, clock=clock)
    except DeadlineExceeded as exc:
        assert "0.01 s deadline" in str(exc)
    else:
        raise AssertionError("the deadline did not fire")


async def test_a_call_waiting_at_a_paused_gateway_is_not_timed_out(upstream, monkeypatch) -> None:
    at_door = asyncio.Event()
    inner = CallLedger.wait_admitted

    async def wait_admitted(ledger: CallLedger, parsed: object) -> None:
        if not ledger.admitting:
            at_door.set()
        await inner(ledger, parsed)  # pyright: ignore[reportArgumentType]

    monkeypatch.setattr(CallLedger, "wait_admitted", wait_admitted)

    @rollout
    async def one_call(task: Task, config: AgentConfig) -> str | None:
        async with openai.AsyncOpenAI(base_url=config.base_url, api_key=config.api_key, max_retries=0) as c:
            reply = await c.chat.completions.create(
                model=config.model, messages=[{"role": "user", "content": "hi"}], **sampling_kwargs(config)
            )
        return reply.choices[0].message.content

    gateway = GatewayConfig(upstreams=[upstream.url], auto_create_sessions=False, health_interval_s=0)
    config = RolloutConfig(n=1, deadline_s=3.0, progress=False, max_retries=0)
    async with RolloutEngine(one_call, None, config, gateway_config=gateway) as engine:
        await engine.client.pause()
        run = asyncio.create_task(engine.run([Task(id="t0", instruction="q")]))
        await at_door.wait()
        await asyncio.sleep(4.0)  # held past the whole deadline (the train step, in a real run)
        await engine.client.resume()
        (episode,) = await run
    assert episode.termination_reason == TerminationReason.DONE, episode.error
