"""The engine leases a sandbox only to a flow that declares one (@needs_sandbox): that flow gets
its own sandbox for the rollout, closed after it; any other flow runs with no lease at all (no
sandbox provider built, no per-rollout context manager). Real engine, gateway and loopback
upstream; the Docker engine is the fake one (tests/fake_docker.py: no Docker daemon here)."""

from __future__ import annotations

from pathlib import Path

from fake_docker import FakeDockerClient

from rllm.engine.rollout.rollout_config import RolloutConfig
from rllm.engine.rollout.rollout_engine import RolloutEngine
from rllm.engine.sandbox.docker import DockerBackend
from rllm.engine.sandbox.provider import SandboxProvider
from rllm.sdk import AgentConfig, Task, rollout
from rllm.sdk.sandbox import current_sandbox, needs_sandbox
from rllm.testing import MockUpstream
from rllm.types import TerminationReason

TASKS = [Task(id=f"t{i}", instruction="hello") for i in range(2)]


@needs_sandbox()
@rollout
async def in_a_sandbox(task: Task, config: AgentConfig) -> dict[str, str]:
    return {"answer": str(id(current_sandbox()))}


@rollout
async def without_one(task: Task, config: AgentConfig) -> dict[str, str]:
    return {"answer": "ok"}


async def test_a_declared_flow_gets_its_own_sandbox_per_rollout_closed_after(tmp_path: Path) -> None:
    client = FakeDockerClient(tmp_path)
    provider = SandboxProvider(DockerBackend(client=client))
    upstream = await MockUpstream().start()
    try:
        config = RolloutConfig(n=2, progress=False)
        async with RolloutEngine(
            in_a_sandbox, None, config, upstreams=[upstream.url], sandboxes=provider
        ) as engine:
            episodes = await engine.run(TASKS)
            assert not provider.open  # every lease ended with its rollout
    finally:
        await upstream.stop()
    assert [e.termination_reason for e in episodes] == [TerminationReason.DONE] * 4
    assert len({e.artifacts["answer"] for e in episodes}) == 4  # one sandbox each
    assert len(client.runs) == 4
    assert all("sandbox_acquire_s" in e.metrics for e in episodes)


async def test_a_flow_without_a_sandbox_runs_with_no_provider_built() -> None:
    upstream = await MockUpstream().start()
    try:
        async with RolloutEngine(
            without_one, None, RolloutConfig(n=2, progress=False), upstreams=[upstream.url]
        ) as engine:
            episodes = await engine.run(TASKS)
            assert engine._sandboxes is None  # pyright: ignore[reportPrivateUsage]
    finally:
        await upstream.stop()
    assert [e.termination_reason for e in episodes] == [TerminationReason.DONE] * 4
    assert all("sandbox_acquire_s" not in e.metrics for e in episodes)
