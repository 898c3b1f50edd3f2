"""A warm pool: sandboxes prepared ahead, in the order the rollouts that need them are scheduled.

The engine tells the pool the specs of the coming rollouts (``schedule``); the pool keeps up to
``size`` of them being created (files written, setup script run) in that order. ``acquire``
hands out the oldest prepared sandbox of the requested spec after checking that it is still
alive (a dead one is closed and a fresh one created), and a slot freed by a hand-out is refilled
from the schedule at once. Sandboxes are never reused: a rollout's leftovers must not reach the
next one, so what a rollout used is closed, not returned.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Iterable
from typing import Any, Protocol, TypeVar

from rllm.sdk.sandbox import Sandbox, SandboxError, SandboxSpec
from rllm.types.errors import InputError

SandboxT = TypeVar("SandboxT", bound=Sandbox)


class SandboxBackend(Protocol):
    """What the pool needs of a backend: create a ready sandbox of a spec."""

    name: str

    async def create(self, spec: SandboxSpec) -> Any: ...


async def prepare(sandbox: SandboxT, spec: SandboxSpec) -> SandboxT:
    """Write the spec's files and run its setup script in a new sandbox (closed if either fails)."""
    try:
        for rel, text in spec.files.items():
            await sandbox.write_file(rel, text)
        if spec.setup:
            result = await sandbox.exec(spec.setup, timeout=spec.setup_timeout_s)
            if not result.ok:
                raise SandboxError(
                    f"sandbox setup script failed (exit {result.exit_code}): {result.stderr[-500:]}"
                )
    except BaseException:
        await sandbox.close()
        raise
    return sandbox


class WarmPool:
    """Up to ``size`` sandboxes prepared ahead of use (``size=0``: every acquire is cold)."""

    def __init__(self, backend: SandboxBackend, size: int = 0) -> None:
        if size < 0:
            raise InputError(f"warm pool size must be >= 0, got {size}")
        self.backend, self.size = backend, size
        self._upcoming: deque[SandboxSpec] = deque()
        self._slots: list[tuple[SandboxSpec, asyncio.Task[Sandbox]]] = []
        self.stats = {"warm": 0, "cold": 0, "dead": 0}

    def schedule(self, specs: Iterable[SandboxSpec]) -> None:
        """Append the specs of rollouts about to run, in the order they will ask for them."""
        self._upcoming.extend(specs)
        self._fill()

    async def acquire(self, spec: SandboxSpec) -> Sandbox:
        key = spec.key
        index = next((i for i, (slot, _) in enumerate(self._slots) if slot.key == key), None)
        if index is None:
            self._forget_one(key)
            self._fill()
            self.stats["cold"] += 1
            return await self.backend.create(spec)
        prepared = self._slots.pop(index)[1]
        self._fill()  # the slot just handed out is replaced by the next scheduled spec
        try:
            sandbox = await prepared
        except SandboxError:
            sandbox = None
        if sandbox is not None and await sandbox.is_alive():
            self.stats["warm"] += 1
            return sandbox
        self.stats["dead"] += 1
        if sandbox is not None:
            await sandbox.close()
        return await self.backend.create(spec)

    async def ready(self) -> None:
        """Wait until every sandbox the pool holds now is prepared (or failed to be)."""
        await asyncio.gather(*(prepared for _, prepared in self._slots), return_exceptions=True)

    @property
    def preparing(self) -> list[SandboxSpec]:
        """The specs held in the pool (being prepared or ready), oldest first."""
        return [spec for spec, _ in self._slots]

    def _forget_one(self, key: bytes) -> None:
        """A spec served cold no longer needs its place in the schedule."""
        for i, spec in enumerate(self._upcoming):
            if spec.key == key:
                del self._upcoming[i]
                return

    def _fill(self) -> None:
        while len(self._slots) < self.size and self._upcoming:
            spec = self._upcoming.popleft()
            self._slots.append((spec, asyncio.ensure_future(self.backend.create(spec))))

    async def close(self) -> None:
        """Close every prepared sandbox and forget the schedule (the pool stays usable)."""
        self._upcoming.clear()
        slots, self._slots = self._slots, []
        for _, prepared in slots:
            prepared.cancel()
        for _, prepared in slots:
            with contextlib.suppress(BaseException):
                sandbox = await prepared
                await sandbox.close()
