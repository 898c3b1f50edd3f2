"""What the engine accepts of a remote agent service's answer. A reward comes from the trainer's
evaluator only: an answer claiming one is refused, evaluator or not. An episode for another task
id is refused. The answer's size and its time from first byte to last are bounded
(``rollout.remote.max_answer_bytes``, ``rollout.remote.answer_timeout_s``): past them the attempt
is an infra error naming the bound. Real agent services and raw HTTP servers on loopback."""

from __future__ import annotations

import asyncio
import contextlib

import msgspec
import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rllm.engine.rollout.agent_protocol import RemoteProtocolError, decode_answer
from rllm.engine.rollout.agent_server import AgentServer
from rllm.engine.rollout.remote_executor import RemoteSettings
from rllm.engine.rollout.rollout_config import RolloutConfig
from rllm.engine.rollout.rollout_engine import RolloutEngine
from rllm.engine.training.trainer_config import config_from_dict
from rllm.sdk import AgentConfig, Task, rollout
from rllm.types import ConfigError, Episode, InvariantError, Step, TerminationReason, Trajectory, to_json

pytestmark = pytest.mark.timeout(120)


def tasks(n: int = 1) -> list[Task]:
    return [Task(id=f"t{i}", instruction=f"What is 2+2? #{i}", ground_truth="4") for i in range(n)]


def remote_config(url: str, **remote) -> RolloutConfig:
    return RolloutConfig(
        n=1,
        executor="remote",
        remote=RemoteSettings(urls=[url], health_interval_s=60, **remote),
        progress=False,
        max_retries=0,
    )


async def call_model(config: AgentConfig) -> None:
    async with openai.AsyncOpenAI(base_url=config.base_url, api_key=config.api_key, max_retries=0) as client:
        await client.chat.completions.create(
            model=config.model, messages=[{"role": "user", "content": "2+2? #0"}]
        )


CLAIMS = {
    "trajectory reward": lambda task_id: Episode(
        task_id=task_id, trajectories=[Trajectory(role="default", reward=1.0)]
    ),
    "is_correct": lambda task_id: Episode(task_id=task_id, is_correct=True),
    "reward metric": lambda task_id: Episode(task_id=task_id, metrics={"reward": 1.0}),
    "step reward": lambda task_id: Episode(
        task_id=task_id, trajectories=[Trajectory(role="default", steps=[Step(reward=1.0)])]
    ),
}


@pytest.mark.parametrize("claim", sorted(CLAIMS))
async def test_a_service_that_reports_its_own_reward_is_refused_without_an_evaluator(upstream, claim):
    @rollout
    async def self_rewarding(task: Task, config: AgentConfig) -> Episode:
        await call_model(config)
        return CLAIMS[claim](task.id)

    async with (
        AgentServer(self_rewarding) as service,
        RolloutEngine(None, None, remote_config(service.url), upstreams=[upstream.url]) as engine,
    ):
        [ep] = await engine.run(tasks())
    assert ep.termination_reason == TerminationReason.INFRA_ERROR, ep.error
    assert ep.error is not None and "claims a reward" in ep.error.message, ep.error
    assert ep.metrics["reward"] == 0.0 and all(t.reward == 0.0 for t in ep.trajectories)
    assert ep.is_correct is not True


async def test_an_episode_for_another_task_is_refused(upstream):
    @rollout
    async def confused(task: Task, config: AgentConfig) -> Episode:
        await call_model(config)
        return Episode(task_id="someone-else", artifacts={"answer": "4"})

    async with (
        AgentServer(confused) as service,
        RolloutEngine(None, None, remote_config(service.url), upstreams=[upstream.url]) as engine,
    ):
        [ep] = await engine.run(tasks())
    assert ep.termination_reason == TerminationReason.INFRA_ERROR, ep.error
    assert ep.error is not None and "'someone-else'" in ep.error.message and "'t0'" in ep.error.message


_rewards = st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False, width=32))


@given(
    answered_id=st.sampled_from(["t0", "t1"]),
    trajectory_rewards=st.lists(_rewards, max_size=3),
    step_reward=_rewards,
    is_correct=st.one_of(st.none(), st.booleans()),
    metric=st.sampled_from([None, "reward", "latency"]),
)
def test_decode_refuses_exactly_the_answers_that_claim_a_reward_or_another_task(
    answered_id, trajectory_rewards, step_reward, is_correct, metric
):
    trajectories = [Trajectory(role=f"r{i}", reward=r) for i, r in enumerate(trajectory_rewards)]
    if trajectories:
        trajectories[0].steps = [Step(reward=step_reward)]
    episode = Episode(
        task_id=answered_id,
        trajectories=trajectories,
        is_correct=is_correct,
        metrics={metric: 1.0} if metric else {},
        artifacts={"answer": "4"},
    )
    claims = (
        any(r is not None for r in trajectory_rewards)
        or (bool(trajectories) and step_reward is not None)
        or is_correct is not None
        or metric == "reward"
    )
    body = to_json(episode)
    if answered_id != "t0" or claims:
        with pytest.raises(RemoteProtocolError, match=r"claims a reward|episode of task"):
            decode_answer(body, "t0")
    else:
        assert decode_answer(body, "t0").artifacts == {"answer": "4"}


class RawService:
    """A loopback HTTP server written on raw sockets: healthy on ``GET /health``; ``POST
    /rollouts`` is answered by ``answer(writer)``. ``release`` ends every answer still running."""

    def __init__(self, answer) -> None:
        self.answer = answer
        self.release = asyncio.Event()
        self.rollouts = 0
        self.gone = asyncio.Event()  # the engine dropped an answer's connection

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                (
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ),
                0,
            )
            await reader.readexactly(length)
            if head.startswith(b"GET /health"):
                body = b'{"status": "ok"}'
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                    % (len(body), body)
                )
            else:
                self.rollouts += 1
                await self.answer(self, writer)
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            self.gone.set()
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        self.release.set()
        self.server.close()
        await self.server.wait_closed()


async def endless_chunks(service: RawService, writer: asyncio.StreamWriter) -> None:
    """A chunked 200 that never ends (until the engine hangs up)."""
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b'{"answer": "' + b"4" * 4000
    while not service.release.is_set():
        writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        await writer.drain()  # raises once the engine has dropped the connection


async def huge_length(service: RawService, writer: asyncio.StreamWriter) -> None:
    """A 200 announcing 10 GB, then the start of it."""
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 10000000000\r\n\r\n{")
    await writer.drain()
    await service.release.wait()


async def stall_mid_body(service: RawService, writer: asyncio.StreamWriter) -> None:
    """Headers and the first bytes of a 1000-byte body, then nothing until released."""
    writer.write(
        b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"answer": "4'
    )
    await writer.drain()
    await service.release.wait()


@pytest.mark.parametrize("answer", [endless_chunks, huge_length], ids=["endless", "announced-10GB"])
async def test_an_answer_over_the_size_bound_is_an_infra_error_naming_the_bound(upstream, answer):
    service = RawService(answer)
    async with service as url:
        config = remote_config(url, max_answer_bytes=256 * 1024)
        async with RolloutEngine(None, None, config, upstreams=[upstream.url]) as engine:
            [ep] = await engine.run(tasks())
        if answer is endless_chunks:
            await service.gone.wait()  # the connection was dropped, not left streaming
    assert ep.termination_reason == TerminationReason.INFRA_ERROR, ep.error
    assert ep.error is not None and "exceeds the limit of 262144" in ep.error.message, ep.error
    assert "rollout.remote.max_answer_bytes" in ep.error.message
    assert service.rollouts == 1


async def test_an_answer_that_stalls_mid_body_is_an_infra_error_naming_the_bound(upstream):
    """The deadline (10 minutes) is far off: the answer's own bound ends the wait."""
    service = RawService(stall_mid_body)
    async with service as url:
        config = remote_config(url, answer_timeout_s=0.5)
        async with RolloutEngine(None, None, config, upstreams=[upstream.url]) as engine:
            [ep] = await engine.run(tasks())
    assert ep.termination_reason == TerminationReason.INFRA_ERROR, ep.error
    assert ep.error is not None and "did not finish within 0.5 s of its first byte" in ep.error.message
    assert "rollout.remote.answer_timeout_s" in ep.error.message


def test_the_answer_bounds_are_checked_and_a_typo_is_refused():
    assert RemoteSettings().max_answer_bytes == 64 << 20 and RemoteSettings().answer_timeout_s > 0
    with pytest.raises(InvariantError, match="max_answer_bytes"):
        RemoteSettings(max_answer_bytes=0)
    with pytest.raises(InvariantError, match="answer_timeout_s"):
        RemoteSettings(answer_timeout_s=0)
    with pytest.raises(ConfigError) as caught:
        config_from_dict({"cookbook": "say", "rollout": {"remote": {"max_answer_byte": 1 << 20}}})
    assert caught.value.key == "rollout.remote.max_answer_byte"
    with pytest.raises(ConfigError) as caught:
        config_from_dict({"cookbook": "say", "rollout": {"remote": {"answer_timeout_s": -1}}})
    assert caught.value.key == "rollout.remote.answer_timeout_s"
    loaded = config_from_dict(
        {"cookbook": "say", "rollout": {"remote": {"max_answer_bytes": 1 << 20, "answer_timeout_s": 5}}}
    )
    assert msgspec.structs.asdict(loaded.rollout.remote)["max_answer_bytes"] == 1 << 20
