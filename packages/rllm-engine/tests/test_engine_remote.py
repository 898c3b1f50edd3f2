"""The remote executor against real agent services on loopback (rllm.engine.rollout.agent_server) and
against services that answer garbage: balancing, retries elsewhere, classified failures."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import msgspec
import openai
import pytest

from conftest import scripted_reply
from rllm.engine.rollout.agent_protocol import (
    RemoteConfig,
    RolloutAnswer,
    RolloutFailure,
    RolloutRequest,
    protocol_schema,
)
from rllm.engine.rollout.agent_server import AgentServer
from rllm.engine.rollout.remote_executor import RemoteSettings
from rllm.engine.rollout.rollout_config import RolloutConfig
from rllm.engine.rollout.rollout_engine import RolloutEngine
from rllm.runtime.http_client import FastHttpPool
from rllm.runtime.http_messages import Request, Response
from rllm.runtime.http_server import HttpServer
from rllm.sdk import AgentConfig, Task, evaluator, final_answer, rollout
from rllm.testing import MockUpstream
from rllm.testing.waiting import wait_until
from rllm.types import Episode, InvariantError, Step, TerminationReason, Trajectory
from rllm.types.errors import StateError

SCHEMA = Path(__file__).parents[3] / "docs" / "remote-agents.schema.json"


@evaluator
def contains_four(task: Task, episode) -> bool:
    return "4" in final_answer(episode)


def tasks(n: int) -> list[Task]:
    return [Task(id=f"t{i}", instruction=f"What is 2+2? #{i}", ground_truth="4") for i in range(n)]


def remote_config(urls: list[str], **kw) -> RolloutConfig:
    kw = {"n": 2, "concurrency": 4, "progress": False, "retry_backoff_s": 0.01, **kw}
    return RolloutConfig(executor="remote", remote=RemoteSettings(urls=urls, health_interval_s=60), **kw)


class Agent:
    """A flow that answers through the openai client; ``hold`` makes it wait after its call."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.hold: asyncio.Event | None = None
        self.holding = 0

    @property
    def flow(self):
        @rollout
        async def agent(task: Task, config: AgentConfig) -> dict:
            async with openai.AsyncOpenAI(
                base_url=config.base_url, api_key=config.api_key, max_retries=0
            ) as c:
                reply = await c.chat.completions.create(
                    model=config.model, messages=[{"role": "user", "content": str(task.instruction)}]
                )
            if self.hold is not None:
                self.holding += 1
                await self.hold.wait()
            return {"answer": reply.choices[0].message.content, "served_by": self.name}

        return agent


@pytest.fixture
async def upstream():
    m = await MockUpstream(responder=scripted_reply).start()
    yield m
    await m.stop()


async def test_two_services_share_the_load_and_a_killed_one_is_retried_on_the_other(upstream):
    a, b = Agent("a"), Agent("b")
    a.hold = asyncio.Event()  # a's rollouts stay in flight until it is killed
    service_a = await AgentServer(a.flow).start()
    service_b = await AgentServer(b.flow).start()
    try:
        config = remote_config([service_a.url, service_b.url], n=2, concurrency=4)
        async with RolloutEngine(None, contains_four, config, upstreams=[upstream.url]) as engine:
            run = asyncio.create_task(engine.run(tasks(2)))
            await wait_until(lambda: a.holding == 2, what="service a holding its 2 rollouts")
            await service_a.stop()  # killed mid-step: its connections are dropped
            episodes = await run
    finally:
        await service_b.stop()
    assert sorted((e.task_id, e.rollout_index) for e in episodes) == [
        (f"t{i}", r) for i in range(2) for r in range(2)
    ]
    for ep in episodes:
        assert ep.termination_reason == TerminationReason.DONE, ep.error
        assert ep.is_correct
        assert ep.artifacts["served_by"] == "b"
        # Only the successful attempt's call: the killed attempt's session was discarded with it.
        [trajectory] = ep.trajectories
        assert len(trajectory.steps) == 1
        assert ep.metadata["remote"]["url"] == service_b.url
    assert sorted(ep.metrics["attempts"] for ep in episodes) == [1.0, 1.0, 2.0, 2.0]
    assert service_b.served == 4  # each rollout ran on b exactly once


async def test_agent_failure_on_the_service_is_an_agent_error_not_retried(upstream):
    @rollout
    async def broken(task: Task, config: AgentConfig) -> dict:
        raise KeyError("no tool named calculator")

    async with AgentServer(broken) as service:
        config = remote_config([service.url], n=1)
        async with RolloutEngine(None, contains_four, config, upstreams=[upstream.url]) as engine:
            [ep] = await engine.run(tasks(1))
    assert ep.termination_reason == TerminationReason.AGENT_ERROR
    assert ep.error is not None and "KeyError" in ep.error.message and "calculator" in ep.error.message
    assert ep.metrics["attempts"] == 1.0


async def test_remote_deadline_is_a_timeout(upstream):
    @rollout
    async def slow(task: Task, config: AgentConfig) -> str:
        await asyncio.Event().wait()
        return ""

    async with AgentServer(slow) as service:
        config = remote_config([service.url], n=1, deadline_s=1)
        async with RolloutEngine(None, contains_four, config, upstreams=[upstream.url]) as engine:
            [ep] = await engine.run(tasks(1))
        await wait_until(lambda: service.active == 0, what="the service cancelling the abandoned rollout")
    assert ep.termination_reason == TerminationReason.TIMEOUT


class GarbageService:
    """Healthy on /health; answers /rollouts with ``status`` and ``body``."""

    def __init__(self, status: int, body: bytes) -> None:
        self.status, self.body, self.calls = status, body, 0

    async def _dispatch(self, request: Request) -> Response:
        if request.path == "/health":
            return Response(body=b'{"status": "ok"}')
        self.calls += 1
        return Response(status=self.status, body=self.body, content_type="text/html")

    async def start(self) -> str:
        self.server = HttpServer(
            self._dispatch, lambda s, m: Response(status=s, body=m.encode()), max_body_bytes=1 << 20
        )
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.setblocking(False)
        await self.server.start(sock)
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


GARBAGE = [
    (200, b"<html>oops</html>", "non-JSON"),
    (200, b"[1, 2]", "not a JSON object"),
    (200, b'{"answer": 5}', "is not an Episode"),
    (200, b'{"task_id": "t0", "trajectories": "many"}', "is not an Episode"),
    (422, b'{"oops": true}', "422 answer"),
    (500, b"<h1>Internal Server Error</h1>", "HTTP 500"),
]


@pytest.mark.parametrize(("status", "body", "says"), GARBAGE)
async def test_garbage_answers_are_classified_infra_errors(upstream, status, body, says):
    service = GarbageService(status, body)
    url = await service.start()
    try:
        config = remote_config([url], n=1, max_retries=1)
        config.remote.health_interval_s = 0.001  # probed again (healthy) before the retry
        async with RolloutEngine(None, contains_four, config, upstreams=[upstream.url]) as engine:
            [ep] = await engine.run(tasks(1))
    finally:
        await service.server.stop(0.1)
    assert ep.termination_reason == TerminationReason.INFRA_ERROR
    assert ep.error is not None and says in ep.error.message, ep.error.message
    assert service.calls == 2 and ep.metrics["attempts"] == 2.0  # retried, as any infra error


async def test_no_healthy_service_refuses_to_start(upstream):
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{dead.getsockname()[1]}"  # bound, not listening: refused
    try:
        engine = RolloutEngine(None, contains_four, remote_config([url]), upstreams=[upstream.url])
        with pytest.raises(StateError, match="no agent service answers GET /health"):
            await engine.start()
        await engine.close()
    finally:
        dead.close()


def test_remote_settings_are_checked():
    with pytest.raises(InvariantError, match=r"remote\.urls"):
        RolloutConfig(executor="remote")
    with pytest.raises(InvariantError, match="executor must be"):
        RolloutConfig(executor="cluster")
    with pytest.raises(InvariantError, match="http://"):
        RemoteSettings(urls=["ftp://x"])


def test_the_documented_schema_is_the_protocol():
    """docs/remote-agents.schema.json is generated from the protocol's structs; regenerate it with
    `python -c "from rllm.engine.rollout.agent_protocol import write_schema; write_schema()"`."""
    assert json.loads(SCHEMA.read_text()) == protocol_schema()
    # And the structs accept the documented examples.
    msgspec.json.decode(
        b'{"task": {"id": "t", "instruction": "hi"}, "config": {"base_url": "http://g/v1", "api_key": "k", "model": "m"}}',
        type=RolloutRequest,
    )
    msgspec.json.decode(b'{"answer": "4", "artifacts": {"steps": 3}}', type=RolloutAnswer)
    msgspec.json.decode(
        b'{"error": {"type": "E", "message": "m"}, "termination_reason": "agent_error"}', type=RolloutFailure
    )


async def test_steps_a_service_claims_are_not_trained_on(upstream):
    """A service answering a whole Episode keeps its roles, rewards and artifacts, but only the
    gateway's traces become steps: token ids it made up never reach the trainer."""

    @rollout
    async def forger(task: Task, config: AgentConfig) -> Episode:
        async with openai.AsyncOpenAI(base_url=config.base_url, api_key=config.api_key, max_retries=0) as c:
            await c.chat.completions.create(
                model=config.model, messages=[{"role": "user", "content": "2+2? #0"}]
            )
        forged = Step(prompt_ids=[1, 2, 3], completion_ids=[7, 7, 7], completion_logprobs=[0.0, 0.0, 0.0])
        return Episode(
            task_id=task.id,
            trajectories=[
                Trajectory(role="default", steps=[forged]),
                Trajectory(role="ghost", steps=[forged]),
            ],
            artifacts={"answer": "4"},
        )

    async with (
        AgentServer(forger) as service,
        RolloutEngine(
            None, contains_four, remote_config([service.url], n=1), upstreams=[upstream.url]
        ) as engine,
    ):
        [ep] = await engine.run(tasks(1))
    assert ep.termination_reason == TerminationReason.DONE, ep.error
    by_role = {t.role: t for t in ep.trajectories}
    [step] = by_role["default"].steps  # the traced call, not the forged one
    assert list(step.completion_ids) != [7, 7, 7]
    assert by_role["ghost"].steps == [] and by_role["ghost"].metadata["remote_steps_dropped"] == 1


async def test_a_full_service_answers_503_and_the_rollout_goes_to_the_other(upstream):
    a, b = Agent("a"), Agent("b")
    a.hold = asyncio.Event()
    full = await AgentServer(a.flow, capacity=1).start()
    other = await AgentServer(b.flow).start()
    # Another client (not this engine) takes the full service's one slot, so the engine, which
    # counts only its own rollouts against the capacity, still sends it one: 503.
    outside = RolloutRequest(
        task=tasks(1)[0], config=RemoteConfig(base_url=upstream.url, api_key="x", model="m")
    )
    pool = FastHttpPool(connect_timeout_s=5, read_timeout_s=60, max_idle=0)
    taken = asyncio.create_task(pool.post(full.url + "/rollouts", msgspec.json.encode(outside)))
    try:
        await wait_until(lambda: a.holding == 1, what="the full service holding the outside rollout")
        config = remote_config([full.url, other.url], n=3, concurrency=3, max_retries=5)
        async with RolloutEngine(None, contains_four, config, upstreams=[upstream.url]) as engine:
            episodes = await engine.run(tasks(1))
            full_service = engine.flow.services[0]  # pyright: ignore[reportAttributeAccessIssue]
            assert full_service.failed >= 1 and full_service.down_since is None  # busy is not down
        a.hold.set()
        assert (await taken)[0] == 200
    finally:
        pool.close()
        await full.stop()
        await other.stop()
    assert all(ep.termination_reason == TerminationReason.DONE for ep in episodes), [
        ep.error for ep in episodes
    ]
    assert full.served == 1 and other.served == 3  # each of the engine's rollouts ran once, on b


async def test_rollouts_are_weighted_by_the_capacity_each_service_reports(upstream):
    small, large = Agent("small"), Agent("large")
    release = asyncio.Event()
    small.hold = large.hold = release  # every rollout stays in flight until all 4 are placed
    service_small = await AgentServer(small.flow, capacity=2).start()
    service_large = await AgentServer(large.flow, capacity=6).start()
    try:
        config = remote_config([service_small.url, service_large.url], n=4, concurrency=4)
        async with RolloutEngine(None, contains_four, config, upstreams=[upstream.url]) as engine:
            run = asyncio.create_task(engine.run(tasks(1)))
            await wait_until(lambda: small.holding + large.holding == 4, what="all 4 rollouts placed")
            # Loads 1/2 vs 3/6: the capacity-6 service takes three times the capacity-2 one's share
            # (plain least-loaded would have split them 2 and 2).
            assert (small.holding, large.holding) == (1, 3)
            release.set()
            episodes = await run
            stats = engine.flow.stats()  # pyright: ignore[reportAttributeAccessIssue]
    finally:
        await service_small.stop()
        await service_large.stop()
    assert all(ep.termination_reason == TerminationReason.DONE for ep in episodes)
    assert stats[service_small.url]["failed"] == stats[service_large.url]["failed"] == 0


async def test_when_every_service_is_full_attempts_wait_for_a_slot_instead_of_bouncing(upstream):
    a, b = Agent("a"), Agent("b")
    release = asyncio.Event()
    a.hold = b.hold = release
    service_a = await AgentServer(a.flow, capacity=1).start()
    service_b = await AgentServer(b.flow, capacity=1).start()
    try:
        config = remote_config([service_a.url, service_b.url], n=4, concurrency=4, max_retries=0)
        async with RolloutEngine(None, contains_four, config, upstreams=[upstream.url]) as engine:
            run = asyncio.create_task(engine.run(tasks(1)))
            await wait_until(lambda: a.holding == b.holding == 1, what="each service holding one rollout")
            release.set()
            episodes = await run
            stats = engine.flow.stats()  # pyright: ignore[reportAttributeAccessIssue]
    finally:
        await service_a.stop()
        await service_b.stop()
    # No retries allowed: a 503 would have ended a rollout as infra_error.
    assert [ep.termination_reason for ep in episodes] == [TerminationReason.DONE] * 4, [
        ep.error for ep in episodes
    ]
    assert service_a.served + service_b.served == 4
    for url in (service_a.url, service_b.url):
        assert stats[url]["failed"] == 0 and stats[url]["peak"] == 1
