"""The engine's two ways to drive its gateway's admin API give the same episodes: in process
(LocalGatewayClient) when it started the gateway itself, over HTTP (GatewayClient) when attached.
Both finish a rollout with one call that takes the traces and deletes the session."""

from __future__ import annotations

import openai
import pytest

from rllm.engine.rollout.rollout_config import RolloutConfig
from rllm.engine.rollout.rollout_engine import RolloutEngine
from rllm.gateway import GatewayClient, GatewayConfig, GatewayServer, LocalGatewayClient
from rllm.sdk import AgentConfig, Task, rollout
from rllm.types import TerminationReason


@rollout
async def three_turns(task: Task, config: AgentConfig) -> None:
    async with openai.AsyncOpenAI(base_url=config.base_url, api_key=config.api_key, max_retries=0) as client:
        messages = [{"role": "user", "content": task.instruction}]
        for turn in range(3):
            reply = await client.chat.completions.create(model=config.model, messages=messages)
            messages.append({"role": "assistant", "content": reply.choices[0].message.content})
            messages.append({"role": "user", "content": f"go on {turn} #{task.id}"})


def _tasks(n: int) -> list[Task]:
    return [Task(id=f"t{i}", instruction=f"What is 2+2? #{i}") for i in range(n)]


def _summary(episodes) -> list:
    """What must not depend on the admin path: ids, reasons, and every step's exact tokens."""
    return [
        (
            ep.task_id,
            ep.rollout_index,
            ep.termination_reason,
            [
                (s.input[-1].content, list(s.prompt_ids), list(s.completion_ids), list(s.completion_logprobs))
                for t in ep.trajectories
                for s in t.steps
            ],
        )
        for ep in episodes
    ]


@pytest.mark.parametrize("path", ["in_process", "http"])
async def test_owned_and_attached_gateways_give_the_same_episodes(upstream, path):
    config = RolloutConfig(n=2, concurrency=8, progress=False)
    cfg = GatewayConfig(upstreams=[upstream.url], auto_create_sessions=False, health_interval_s=0)
    if path == "in_process":
        engine = RolloutEngine(three_turns, None, config, gateway_config=cfg)
        async with engine:
            assert isinstance(engine.client, LocalGatewayClient)
            episodes = await engine.run(_tasks(4))
            server = engine._server
            assert server.sessions == {} and server.store.trace_count() == 0
        reference = None
    else:
        async with GatewayServer(cfg) as server:
            engine = RolloutEngine(three_turns, None, config, gateway_url=server.url)
            async with engine:
                assert isinstance(engine.client, GatewayClient)
                episodes = await engine.run(_tasks(4))
            assert server.sessions == {} and server.store.trace_count() == 0
        async with RolloutEngine(three_turns, None, config, gateway_config=cfg) as owned:
            reference = await owned.run(_tasks(4))
    assert len(episodes) == 8
    for ep in episodes:
        assert ep.termination_reason == TerminationReason.DONE, ep.error
        (traj,) = ep.trajectories
        assert len(traj.steps) == 3 and all(
            len(s.completion_logprobs) == len(s.completion_ids) for s in traj.steps
        )
        assert traj.steps[-1].input[-1].content == f"go on 1 #{ep.task_id}"
    if reference is not None:
        assert _summary(episodes) == _summary(reference)
