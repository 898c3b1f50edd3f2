"""The asynchronous step's weight syncs lose no call (rllm.engine.training.async_loop over real parts).

Real gateway, real loopback upstream (MockUpstream), real RolloutEngine running a multi-turn
flow through the real openai client; only the backend is a stand-in (it records what it is asked
to train on and bumps its weight version at each sync). Calls take a drawn, heavy-tailed time, so
syncs land while calls are in flight and while others wait at the paused gateway's door.

The upstream answers every call with the backend's weight version at the call's arrival, and
notes it if the version changed before it answered (a sync under a call in flight). So each step
of each episode shows which weights answered it, independently of the gateway's stamp.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import openai
import pytest

from rllm.algos.config import AlgorithmConfig
from rllm.engine.rollout.rollout_config import RolloutConfig
from rllm.engine.rollout.rollout_engine import RolloutEngine
from rllm.engine.training.async_loop import AsyncStepper
from rllm.engine.training.checkpoint import TrainerState
from rllm.engine.training.health_config import HealthSection
from rllm.engine.training.task_sampler import TaskSampler
from rllm.engine.training.train_step import TrainStep
from rllm.engine.training.trainer_config import TrainerConfig, training_rollout
from rllm.gateway import GatewayConfig, GatewayServer
from rllm.sdk import AgentConfig, Task, evaluator, rollout
from rllm.testing import MockUpstream
from rllm.types import Episode, TerminationReason, TrainSequence

TURNS = 3

# The run's first rollout takes this hold and, after its first call (answered ``v<version>``),
# awaits ``hold(version)`` before its second: the test makes it wait until the weights moved past
# K, so its group is stale when it finishes, on any machine, and the stale policy must act on it.
_HOLD: list[Callable[[int], Awaitable[None]]] = []


@rollout
async def multi_turn(task: Task, config: AgentConfig) -> dict[str, str]:
    hold = _HOLD.pop() if _HOLD else None
    async with openai.AsyncOpenAI(base_url=config.base_url, api_key=config.api_key, max_retries=0) as client:
        messages: list[Any] = [{"role": "user", "content": task.instruction}]
        answer = ""
        for turn in range(TURNS):
            if hold is not None and turn == 1:
                await hold(int(answer[1:]))
            reply = await client.chat.completions.create(model=config.model, messages=messages)
            answer = reply.choices[0].message.content or ""
            messages += [
                {"role": "assistant", "content": answer},
                {"role": "user", "content": f"turn {turn}"},
            ]
    return {"answer": answer}


@evaluator
def odd_task(task: Task, episode: Episode) -> bool:
    return int(task.id[1:]) % 2 == 1


class VersionedBackend:
    """Trains on nothing; each sync is a new weight version, checked against the gateway."""

    name = "versioned"

    def __init__(self, gateway: GatewayServer) -> None:
        self.gateway = gateway
        self.version = 0
        self.syncs_with_calls_in_flight = 0
        self.trained: list[TrainSequence] = []
        self._synced = asyncio.Condition()

    async def train_step(self, batch: list[TrainSequence], algo: AlgorithmConfig) -> dict[str, float]:
        self.trained.extend(batch)
        await asyncio.sleep(0)  # the rollouts go on meanwhile
        return {"loss": 0.0}

    async def sync_weights(self) -> int:
        self.syncs_with_calls_in_flight += self.gateway.inflight > 0
        async with self._synced:
            self.version += 1
            self._synced.notify_all()
        return self.version

    async def reached(self, version: int) -> None:
        """Return once the weights are at ``version`` or newer."""
        async with self._synced:
            await self._synced.wait_for(lambda: self.version >= version)

    def served_model_name(self) -> str:
        return "mock-model"


class VersionedUpstream:
    """The responder: answers ``v<version at arrival>`` after a drawn, heavy-tailed delay."""

    def __init__(self, backend: VersionedBackend, seed: int) -> None:
        self.backend = backend
        self.rng = random.Random(seed)
        self.changed_under_call = 0

    async def __call__(self, body: dict[str, Any]) -> str:
        version = self.backend.version
        # Mostly quick, now and then one far slower than a training step.
        await asyncio.sleep(self.rng.choice((0.0, 0.001, 0.002, 0.005, 0.05)))
        self.changed_under_call += self.backend.version != version
        return f"v{version}"


class RecordingEngine(RolloutEngine):
    """Keeps every rollout that finished, whether its group was trained on, re-queued, dropped,
    still waiting for the trainer or still waiting for its siblings; counts the ones running."""

    finished: list[Episode]
    running = 0

    async def run_one(
        self,
        task: Task,
        rollout_index: int = 0,
        is_validation: bool = False,
        *,
        model: str | None = None,
        sampling: Any = None,
    ) -> Episode:
        self.running += 1
        try:
            episode = await super().run_one(
                task, rollout_index, is_validation, model=model, sampling=sampling
            )
            self.finished.append(episode)
        finally:
            self.running -= 1
        return episode


async def _settle(engine: RecordingEngine, server: GatewayServer) -> None:
    """After a pause (no call is answered any more): wait until every rollout still running holds
    a call at the gateway's door. A rollout that has just taken its session's traces (finished
    the session) and is still building or scoring its episode holds its answered calls in
    neither a trace nor a finished episode; cancelling it there would discard them. This is the
    condition itself, checked as it changes (the scoring runs in a thread), not a guessed delay."""

    async def settled() -> None:
        while engine.running != server.waiting:
            await asyncio.sleep(0.001)

    await asyncio.wait_for(settled(), 30)


class FakeTrainer:
    def __init__(self, config: TrainerConfig, backend: VersionedBackend, tasks: list[Task]) -> None:
        self.config, self.backend = config, backend
        # The Trainer's own sampler: the seeded order, or rollout.curriculum's draws.
        self.sampler = TaskSampler(tasks, seed=config.seed, settings=config.rollout.curriculum)
        self.out_dir = Path("unused")  # sample_groups = 0: nothing is written
        self.train_step = TrainStep(config, cast(Any, backend), self.out_dir)  # the Trainer's own step


def _calls(server: GatewayServer, status: str) -> int:
    server.metrics.flush()
    value = server.metrics.registry.get_sample_value("rllm_gateway_llm_calls_total", {"status": status})
    return int(value or 0)


@pytest.mark.parametrize(
    ("k", "policy", "seed"),
    [
        (1, "requeue", 0),
        (2, "drop", 1),
        (1, "drop", 2),
    ],
)
async def test_weight_syncs_drain_calls_and_every_call_ends_in_an_episode(
    k: int, policy: str, seed: int
) -> None:
    tasks = [Task(id=f"t{i}", instruction=f"task {i}") for i in range(9)]
    config = TrainerConfig(
        cookbook="fake",
        total_steps=6,
        tasks_per_step=2,
        group_size=3,
        sample_groups=0,
        progress=False,
        algorithm=AlgorithmConfig(filter_zero_variance=False, tis="token"),
        health=HealthSection(probe_sequences=0),  # the stand-in backend has no sampler to probe
        rollout=training_rollout(max_staleness=k, stale_policy=policy, concurrency=12),
    )
    async with MockUpstream(model="mock-model") as upstream:
        server = GatewayServer(
            GatewayConfig(upstreams=[upstream.url], health_interval_s=0, auto_create_sessions=False)
        )
        await server.start()
        backend = VersionedBackend(server)
        responder = VersionedUpstream(backend, seed)
        upstream.responder = responder
        engine = RecordingEngine(
            multi_turn,
            odd_task,
            RolloutConfig(concurrency=12, progress=False, model="mock-model"),
            gateway_url=server.url,
        )
        engine.finished = []
        _HOLD[:] = [lambda first: backend.reached(first + k + 1)]
        await engine.start()
        stepper = AsyncStepper(cast(Any, FakeTrainer(config, backend, tasks)), engine, TrainerState())
        try:
            stepper.start()
            rows = [await stepper.step() for _ in range(config.total_steps)]
            # Stop the way a sync does: calls in flight finish, new ones wait at the door (and are
            # then cancelled there, before the gateway opened a trace or sent anything upstream).
            await engine.client.pause()
            await _settle(engine, server)
            # The calls of rollouts still running: their sessions hold them.
            unfinished = await engine.client.query_traces()
            await stepper.close()
        finally:
            await engine.close()
            await server.stop()

    assert backend.syncs_with_calls_in_flight == 0
    assert responder.changed_under_call == 0  # drained: no call straddles a sync
    assert backend.version == config.total_steps
    # Every call the upstream answered is a step of a finished episode, answered by the version
    # the gateway stamped on it, or a trace of a rollout still running at the end; none was lost,
    # failed or aborted by a sync.
    steps = [s for e in engine.finished for t in e.trajectories for s in t.steps]
    assert all(e.termination_reason == TerminationReason.DONE for e in engine.finished)
    assert all(len(t.steps) == TURNS for e in engine.finished for t in e.trajectories)
    assert all(t.status == "ok" and len(t.messages) < 2 * TURNS for t in unfinished)
    assert len(steps) + len(unfinished) == upstream.stats.by_path["/v1/chat/completions"]
    assert _calls(server, "ok") == len(steps) + len(unfinished)
    assert _calls(server, "error") == _calls(server, "abort") == 0
    assert all(s.output is not None and s.output.text == f"v{s.weight_version}" for s in steps)
    assert all(t.response is not None and t.response.text == f"v{t.weight_version}" for t in unfinished)
    # The syncs really interleaved with rollouts: episodes ran on several versions, some spanning two.
    assert len({s.weight_version for s in steps}) > 2
    assert max(row["async/staleness_max"] for row in rows) <= k
    # The held group (at least) went stale and was dropped or re-queued, as configured, and counted.
    counted = {p: sum(row[f"async/{p}_groups"] for row in rows) for p in ("dropped", "requeued")}
    assert counted["dropped" if policy == "drop" else "requeued"] >= 1
    assert counted["requeued" if policy == "drop" else "dropped"] == 0
    assert len(backend.trained) == config.total_steps * config.tasks_per_step * config.group_size
