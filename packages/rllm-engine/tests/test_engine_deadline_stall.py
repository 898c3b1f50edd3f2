"""A rollout's deadline counts the time it was stalled, not the time its model call waited behind
the other rollouts of its batch at one shared sampler (rllm.engine.rollout.flow_runner).

The upstream is a real loopback server with one slot: it answers one call at a time, so a batch's
calls queue and the last one waits for all the others. The queue is longer than the deadline
(by construction, whatever the machine's speed: every call holds the slot at least
``SERVICE_S``), so a wall-clock deadline cuts the queued rollouts off; a stall deadline does not.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import openai

from rllm.engine.rollout.rollout_config import RolloutConfig
from rllm.engine.rollout.rollout_engine import RolloutEngine
from rllm.gateway import GatewayConfig
from rllm.sdk import AgentConfig, Task, rollout, sampling_kwargs
from rllm.testing import MockUpstream
from rllm.types import TerminationReason

SERVICE_S = 0.2  # each call holds the sampler's one slot this long
QUEUED = 32  # so the last call waits at least 32 * 0.2 = 6.4 s, past the deadline
DEADLINE_S = 5.0  # generous: a busy machine may stall the loop a second or two between answers
# One HTTP client for every flow: building one per rollout (its TLS context) costs each flow a
# slice of a busy CPU, time that is the flow's own and would blur what the test measures.
_http: list[httpx.AsyncClient] = []


@rollout
async def one_call(task: Task, config: AgentConfig) -> str | None:
    if task.instruction == "hang":  # stuck in its own code: no model call to wait on
        await asyncio.Event().wait()
    client = openai.AsyncOpenAI(
        base_url=config.base_url, api_key=config.api_key, max_retries=0, http_client=_http[0]
    )
    reply = await client.chat.completions.create(
        model=config.model,
        messages=[{"role": "user", "content": task.instruction}],
        **sampling_kwargs(config),
    )
    return reply.choices[0].message.content


class OneSlotSampler:
    """Answers one call at a time (the batch's latency is shared); ``stall`` is never answered
    until released."""

    def __init__(self) -> None:
        self.slot = asyncio.Lock()
        self.release = asyncio.Event()
        self.answered = 0

    async def __call__(self, body: dict[str, Any]) -> str:
        if body["messages"][-1]["content"] == "stall":
            await self.release.wait()
            return "late"
        async with self.slot:
            await asyncio.sleep(SERVICE_S)  # the sampler's work on this call, not a synchronisation
            self.answered += 1
            return "The answer is 4."


async def _run_batch(tasks: list[Task]) -> tuple[dict[str, TerminationReason], OneSlotSampler]:
    sampler = OneSlotSampler()
    async with MockUpstream(responder=sampler) as upstream, httpx.AsyncClient(timeout=None) as http:
        _http[:] = [http]
        gateway = GatewayConfig(upstreams=[upstream.url], auto_create_sessions=False, health_interval_s=0)
        config = RolloutConfig(n=1, deadline_s=DEADLINE_S, progress=False, max_retries=0, concurrency=64)
        try:
            # A first call, outside any deadline, warms the client library up (its first call
            # imports what it needs: seconds on a busy machine, and the flow's own time).
            warm = openai.AsyncOpenAI(base_url=upstream.url, api_key="EMPTY", max_retries=0, http_client=http)
            await warm.chat.completions.create(model="m", messages=[{"role": "user", "content": "warm"}])
            sampler.answered = 0
            async with RolloutEngine(one_call, None, config, gateway_config=gateway) as engine:
                episodes = await engine.run(tasks)
        finally:
            sampler.release.set()  # the stalled call may now end, so the upstream can stop
    return {e.task_id: e.termination_reason for e in episodes}, sampler


async def test_rollouts_queued_behind_a_shared_sampler_are_not_cut_off() -> None:
    tasks = [Task(id=f"q{i}", instruction=f"what is 2+2? #{i}") for i in range(QUEUED)]
    reasons, sampler = await _run_batch(tasks)
    assert set(reasons.values()) == {TerminationReason.DONE}, reasons
    assert sampler.answered == QUEUED


async def test_a_stalled_rollout_is_cut_off_while_the_queued_ones_finish() -> None:
    tasks = [Task(id=f"q{i}", instruction=f"what is 2+2? #{i}") for i in range(QUEUED)]
    tasks += [Task(id="stall", instruction="stall"), Task(id="hang", instruction="hang")]
    reasons, _ = await _run_batch(tasks)
    # Stuck in its own code, or waiting on a call the sampler never answers: cut off.
    assert reasons.pop("hang") == TerminationReason.TIMEOUT
    assert reasons.pop("stall") == TerminationReason.TIMEOUT
    assert set(reasons.values()) == {TerminationReason.DONE}, reasons
