"""Sandboxes for the engine's rollouts: one per rollout of a flow that declares ``@needs_sandbox``,
created from (or ahead of time by) the warm pool and always closed when the rollout ends —
on success, error, deadline or cancellation."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from typing import Any

from rllm.engine.sandbox.pool import SandboxBackend, WarmPool
from rllm.sdk.sandbox import Sandbox, sandbox_spec_for, using_sandbox
from rllm.types import Task
from rllm.types.errors import InputError


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
    """Leases sandboxes to rollouts from a :class:`WarmPool` over ``backend``."""

    def __init__(self, backend: SandboxBackend, warm: int = 0) -> None:
        self.pool = WarmPool(backend, warm)
        self.open: set[Sandbox] = set()

    def schedule(self, flow: Any, tasks: Iterable[Task]) -> None:
        """Tell the pool which rollouts come next (task order, one entry per rollout)."""
        specs = (sandbox_spec_for(flow, task) for task in tasks)
        self.pool.schedule(spec for spec in specs if spec is not None)

    @contextlib.asynccontextmanager
    async def lease(self, flow: Any, task: Task) -> AsyncIterator[Sandbox | None]:
        """The rollout's sandbox (None when the flow declares none), current inside the block."""
        spec = sandbox_spec_for(flow, task)
        if spec is None:
            yield None
            return
        sandbox = await self.pool.acquire(spec)
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
