"""Sandboxes for the engine's rollouts: one per rollout of a flow that declares ``@needs_sandbox``,
created from (or ahead of time by) the warm pool and always closed when the rollout ends —
on success, error, deadline or cancellation."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterable
from typing import Any

from rllm.engine.sandbox.pool import SandboxBackend, WarmPool
from rllm.sdk.sandbox import Sandbox, sandbox_spec_for, using_sandbox
from rllm.types import Task
from rllm.types.errors import ConfigError, InputError

CONSENT_KEY = "sandbox.allow_task_network"


def make_backend(name: str, **options: Any) -> SandboxBackend:
    """The sandbox backend called ``name``: ``bubblewrap`` (local), ``docker`` or ``e2b`` (hosted)."""
    if name == "bubblewrap":
        from rllm.engine.sandbox.bubblewrap import BubblewrapBackend

        return BubblewrapBackend(**options)
    if name == "docker":
        from rllm.engine.sandbox.docker import DockerBackend

        return DockerBackend(**options)
    if name == "e2b":
        from rllm.engine.sandbox.e2b import E2BBackend

        return E2BBackend(**options)
    raise InputError(f"sandbox_backend: no sandbox backend named {name!r} (bubblewrap, docker, e2b)")


class SandboxProvider:
    """Leases sandboxes to rollouts from a :class:`WarmPool` over ``backend``.

    A task whose own data asks for the network (a task directory's ``network = true``, kept in
    its ``metadata["sandbox"]``) gets it only with the operator's consent, ``allow_task_network``
    (``sandbox.allow_task_network`` in a training config, ``RolloutConfig.sandbox_allow_task_network``
    for an engine); without it the run is refused before any rollout
    starts. (A spec the flow's code sets itself is the flow author's decision, not the dataset's.)
    """

    def __init__(self, backend: SandboxBackend, warm: int = 0, *, allow_task_network: bool = False) -> None:
        self.pool = WarmPool(backend, warm)
        self.open: set[Sandbox] = set()
        self.allow_task_network = allow_task_network

    def schedule(self, flow: Any, tasks: Iterable[Task]) -> None:
        """Tell the pool which rollouts come next (task order, one entry per rollout); refuses
        (ConfigError) when one of the tasks asks for network without the operator's consent."""
        tasks = list(tasks)
        for task in tasks:
            self.check_consent(task)
        specs = (sandbox_spec_for(flow, task) for task in tasks)
        self.pool.schedule(spec for spec in specs if spec is not None)

    def check_consent(self, task: Task) -> None:
        """ConfigError naming the consent key when ``task``'s data asks for network without it."""
        asked = task.metadata.get("sandbox") if isinstance(task.metadata, dict) else None
        if isinstance(asked, dict) and asked.get("network") and not self.allow_task_network:
            raise ConfigError.for_key(
                CONSENT_KEY,
                f"task {task.id!r} asks for network (network = true in its task.toml); tasks get the "
                f"network only with the operator's consent: set {CONSENT_KEY}=true (the sandbox then "
                "has outbound NAT but not the host's loopback services)",
            )

    @contextlib.asynccontextmanager
    async def lease(
        self, flow: Any, task: Task, metrics: dict[str, float] | None = None
    ) -> AsyncIterator[Sandbox | None]:
        """The rollout's sandbox (None when the flow declares none), current inside the block.
        ``metrics`` receives ``sandbox_acquire_s`` and ``sandbox_warm`` (1.0: from the warm pool)."""
        spec = sandbox_spec_for(flow, task)
        if spec is None:
            yield None
            return
        self.check_consent(task)
        warm_before, started = self.pool.stats["warm"], time.monotonic()
        sandbox = await self.pool.acquire(spec)
        if metrics is not None:
            metrics["sandbox_acquire_s"] = time.monotonic() - started
            metrics["sandbox_warm"] = float(self.pool.stats["warm"] > warm_before)
        self.open.add(sandbox)
        try:
            with using_sandbox(sandbox):
                yield sandbox
        finally:
            self.open.discard(sandbox)
            # Shielded: a cancelled rollout still has its sandbox closed (the kill itself is
            # synchronous in the local backend, so nothing runs on even if this is interrupted).
            await asyncio.shield(sandbox.close())

    async def close(self) -> None:
        for sandbox in list(self.open):
            await sandbox.close()
        await self.pool.close()
