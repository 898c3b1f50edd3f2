"""GatewayGroup: several gateways acting as one ``GatewayAdmin``.

An engine with worker processes gives each its own embedded gateway; a trainer syncing weights,
pausing for a sync or adding an upstream must reach all of them. Settings (weight version,
admission, upstreams, flush) go to every gateway. A session lives on exactly one gateway: one
created through the group goes to the gateway its id hashes to (``session_url`` points there),
and operations on a session id ask every gateway, so sessions a worker created on its own
gateway are found too. Reads of many traces merge what every gateway holds.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from rllm.gateway.admin_api import GatewayAdmin, GatewayAPIError, SessionInfo
from rllm.gateway.client import GatewayClient
from rllm.gateway.trace_query import ALL_TRACES, TraceQuery
from rllm.types import SamplingParams, TraceRecord, new_id
from rllm.types.errors import InputError

_T = TypeVar("_T")


class GatewayGroup:
    """``GatewayGroup(urls, admin_key)``: the gateways at ``urls``, over HTTP (see the module
    docstring); ``members`` are their clients."""

    def __init__(self, urls: Sequence[str], admin_key: str | None = None) -> None:
        self.members: list[GatewayAdmin] = [GatewayClient(url, admin_key=admin_key) for url in urls]
        if not self.members:
            raise InputError("a GatewayGroup needs at least one gateway URL")

    @property
    def url(self) -> str:
        return self.members[0].url

    async def __aenter__(self) -> GatewayGroup:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._all(lambda m: m.close())

    async def _all(self, op: Callable[[GatewayAdmin], Awaitable[_T]]) -> list[_T]:
        return list(await asyncio.gather(*(op(m) for m in self.members)))

    async def _holders(self, op: Callable[[GatewayAdmin], Awaitable[_T]]) -> list[_T]:
        """``op`` on every gateway; the answers of those that know the session. Re-raises the
        first 404 when none does, and any other error as it came."""
        outcomes = await asyncio.gather(*(op(m) for m in self.members), return_exceptions=True)
        answers: list[_T] = []
        missing: GatewayAPIError | None = None
        for outcome in outcomes:
            if isinstance(outcome, GatewayAPIError) and outcome.status == 404:
                missing = missing or outcome
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                answers.append(outcome)
        if not answers and missing is not None:
            raise missing
        return answers

    def _home(self, session_id: str) -> GatewayAdmin:
        """The gateway a session created through the group lives on."""
        return self.members[zlib.crc32(session_id.encode()) % len(self.members)]

    # ----------------------------------------------------------- sessions
    def session_url(self, session_id: str, role: str | None = None) -> str:
        return self._home(session_id).session_url(session_id, role)

    async def create_session(
        self,
        session_id: str | None = None,
        sampling: SamplingParams | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> SessionInfo:
        if session_id is None:
            session_id = new_id()
        if not isinstance(session_id, str):  # what each gateway would answer
            raise GatewayAPIError(400, "'session_id' must be a string", "POST", "/admin/sessions", "400")
        return await self._home(session_id).create_session(session_id, sampling, metadata)

    async def list_sessions(self) -> list[dict[str, Any]]:
        return [s for sessions in await self._all(lambda m: m.list_sessions()) for s in sessions]

    async def delete_session(self, session_id: str) -> int:
        return sum(await self._holders(lambda m: m.delete_session(session_id)))

    async def finish_session(self, session_id: str) -> list[TraceRecord]:
        found = await self._holders(lambda m: m.finish_session(session_id))
        return sorted((r for records in found for r in records), key=lambda r: r.seq)

    async def get_traces(self, session_id: str, role: str | None = None) -> list[TraceRecord]:
        found = await self._all(lambda m: m.get_traces(session_id, role))
        return sorted((r for records in found for r in records), key=lambda r: r.seq)

    async def query_traces(self, query: TraceQuery = ALL_TRACES) -> list[TraceRecord]:
        found = await self._all(lambda m: m.query_traces(query))
        merged = sorted((r for records in found for r in records), key=lambda r: (r.created_at, r.seq))
        return merged[: query.limit] if query.limit is not None else merged

    async def flush(self) -> None:
        await self._all(lambda m: m.flush())

    # ----------------------------------------------------------- weights & admission
    async def get_weight_version(self) -> int:
        """The lowest version any gateway stamps (all equal after ``set_weight_version``)."""
        return min(await self._all(lambda m: m.get_weight_version()))

    async def set_weight_version(self, version: int) -> None:
        await self._all(lambda m: m.set_weight_version(version))

    async def set_policy_models(self, models: dict[str, str]) -> None:
        await self._all(lambda m: m.set_policy_models(models))

    async def pause(self, timeout_s: float = 600.0) -> None:
        """Pause every gateway; if any fails to drain in time, every one is resumed (as a single
        gateway whose pause times out keeps running) and the failure is raised."""
        outcomes = await asyncio.gather(*(m.pause(timeout_s) for m in self.members), return_exceptions=True)
        failed = [o for o in outcomes if isinstance(o, BaseException)]
        if failed:
            await asyncio.gather(*(m.resume() for m in self.members), return_exceptions=True)
            raise failed[0]

    async def resume(self) -> None:
        await self._all(lambda m: m.resume())

    # ----------------------------------------------------------- upstreams
    async def add_upstream(self, url: str) -> dict[str, Any]:
        return (await self._all(lambda m: m.add_upstream(url)))[0]

    async def remove_upstream(self, url: str) -> None:
        await self._all(lambda m: m.remove_upstream(url))

    async def list_upstreams(self) -> list[dict[str, Any]]:
        """The first gateway's upstreams (every gateway of a group has the same ones)."""
        return await self.members[0].list_upstreams()

    async def health(self) -> dict[str, Any]:
        """The single-gateway fields over the whole group (``paused`` if any gateway is, counts
        summed, the lowest weight version and healthy count), plus each gateway's own under
        ``gateways``."""
        each = await self._all(lambda m: m.health())
        first = each[0]
        return {
            "status": "ok" if all(h.get("status") == "ok" for h in each) else "degraded",
            "upstreams": first.get("upstreams"),
            "healthy_upstreams": min(h.get("healthy_upstreams", 0) for h in each),
            "paused": any(h.get("paused") for h in each),
            "inflight": sum(h.get("inflight", 0) for h in each),
            "waiting": sum(h.get("waiting", 0) for h in each),
            "parked": sum(h.get("parked", 0) for h in each),
            "weight_version": min(h.get("weight_version", 0) for h in each),
            "gateways": each,
        }


__all__ = ["GatewayGroup"]
