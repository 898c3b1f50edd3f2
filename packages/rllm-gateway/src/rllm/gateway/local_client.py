"""LocalGatewayClient: GatewayClient's admin API as direct calls into a GatewayServer in this process.

An engine that starts its own gateway would otherwise pay three loopback HTTP round trips per
rollout to itself (create session, read traces, delete session): request encoding, parsing,
routing and a msgpack round trip of every trace, on the same CPU that runs the flows. This
client calls the server's session and trace machinery directly, on the server's event loop.

It is a ``GatewayAdmin`` like :class:`~rllm.gateway.client.GatewayClient` (same methods, same
results, errors raised as ``GatewayAPIError`` with the HTTP status and code the route would have
answered). It acts as the admin: whoever holds the server object owns it already.
Agents still reach the gateway over HTTP at ``session_url``. From another thread or process,
use ``GatewayClient(server.url)``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from rllm.gateway.admin_api import GatewayAPIError, SessionInfo, session_base_url
from rllm.gateway.errors import GatewayError
from rllm.gateway.trace_query import ALL_TRACES, TraceQuery
from rllm.types import SamplingParams, TraceRecord, from_msgpack, to_msgpack
from rllm.types.errors import StateError

if TYPE_CHECKING:
    from rllm.gateway.ports import GatewayOps

_T = TypeVar("_T")
_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


def _as_json(value: Any) -> Any:
    """What the HTTP client would have decoded: fresh builtins, not the server's live objects."""
    return _decode(_encode(value))


def _copies(records: list[TraceRecord]) -> list[TraceRecord]:
    """Independent copies of records the store still holds, so a caller cannot mutate the store."""
    return from_msgpack(to_msgpack(records), list[TraceRecord]) if records else []


class LocalGatewayClient:
    """In-process admin client for ``server`` (see the module docstring). ``server.local_client()``."""

    def __init__(self, server: GatewayOps) -> None:
        self.server = server
        self.admin_key: str | None = None

    @property
    def url(self) -> str:
        return self.server.url

    async def __aenter__(self) -> LocalGatewayClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Nothing to release; the server's owner stops the server."""

    def _check(self, method: str, path: str) -> None:
        loop = self.server.serving_loop
        if loop is None:
            raise GatewayAPIError(503, "the gateway server is not running", method, path)
        if asyncio.get_running_loop() is not loop:
            raise StateError(
                "LocalGatewayClient must be used on the event loop its GatewayServer runs on; "
                f"from another thread use GatewayClient({self.server.url!r})"
            )

    async def _run(self, method: str, path: str, op: Callable[[], Awaitable[_T]]) -> _T:
        self._check(method, path)
        try:
            return await op()
        except GatewayError as exc:
            raise GatewayAPIError(exc.status, exc.message, method, path, exc.code) from None

    def _sync(self, method: str, path: str, op: Callable[[], _T]) -> _T:
        self._check(method, path)
        try:
            return op()
        except GatewayError as exc:
            raise GatewayAPIError(exc.status, exc.message, method, path, exc.code) from None

    # ----------------------------------------------------------- sessions
    def session_url(self, session_id: str, role: str | None = None) -> str:
        """The OpenAI base URL an agent should use for this session (and role)."""
        return session_base_url(self.url, session_id, role)

    async def create_session(
        self,
        session_id: str | None = None,
        sampling: SamplingParams | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> SessionInfo:
        s = self._sync(
            "POST", "/admin/sessions", lambda: self.server.open_session(session_id, sampling, metadata)
        )
        return SessionInfo(s.session_id, s.token, session_base_url(self.url, s.session_id))

    async def list_sessions(self) -> list[dict[str, Any]]:
        url = self.url
        return self._sync(
            "GET",
            "/admin/sessions",
            lambda: _as_json([s.info(url, with_token=False) for s in self.server.sessions.values()]),
        )

    async def delete_session(self, session_id: str) -> int:
        """Delete a session and its traces; returns how many traces were freed."""
        return await self._run(
            "DELETE", f"/admin/sessions/{session_id}", lambda: self.server.close_session(session_id)
        )

    async def finish_session(self, session_id: str) -> list[TraceRecord]:
        """Delete a session and return its traces ordered by ``seq``. The records are handed over,
        not copied: the store no longer holds them."""
        return await self._run(
            "POST",
            f"/admin/sessions/{session_id}/finish",
            lambda: self.server.finish_session(session_id),
        )

    async def get_traces(self, session_id: str, role: str | None = None) -> list[TraceRecord]:
        """The session's traces ordered by ``seq`` (copies: the session keeps its own)."""

        async def op() -> list[TraceRecord]:
            records = await self.server.store.get(session_id)
            if role is not None:
                records = [r for r in records if r.role == role]
            return _copies(records)

        return await self._run("GET", f"/admin/sessions/{session_id}/traces", op)

    async def query_traces(self, query: TraceQuery = ALL_TRACES) -> list[TraceRecord]:
        async def op() -> list[TraceRecord]:
            records = await self.server.store.query(query)
            return _copies(records)

        return await self._run("GET", "/admin/traces", op)

    async def flush(self) -> None:
        """Wait until every trace captured so far is committed to the store."""
        await self._run("POST", "/admin/flush", self.server.store.flush)

    # ----------------------------------------------------------- weights & admission
    async def get_weight_version(self) -> int:
        return self._sync("GET", "/admin/weight_version", lambda: self.server.weight_version)

    async def set_weight_version(self, version: int) -> None:
        self._sync("PUT", "/admin/weight_version", lambda: self.server.set_weight_version(version))

    async def set_policy_models(self, models: dict[str, str]) -> None:
        self._sync("PUT", "/admin/policies", lambda: self.server.set_policy_models(models))

    async def pause(self, timeout_s: float = 600.0) -> None:
        """Stop admitting new requests (they wait) and return once in-flight ones have drained."""
        await self._run("POST", "/admin/pause", lambda: self.server.pause(timeout_s))

    async def resume(self) -> None:
        self._sync("POST", "/admin/resume", self.server.resume)

    # ----------------------------------------------------------- upstreams
    async def add_upstream(self, url: str) -> dict[str, Any]:
        async def op() -> dict[str, Any]:
            return _as_json((await self.server.add_upstream(url)).info())

        return await self._run("POST", "/admin/upstreams", op)

    async def remove_upstream(self, url: str) -> None:
        self._sync("DELETE", "/admin/upstreams", lambda: self.server.remove_upstream(url))

    async def list_upstreams(self) -> list[dict[str, Any]]:
        return self._sync(
            "GET",
            "/admin/upstreams",
            lambda: _as_json([w.info() for w in self.server.pool.upstreams.values()]),
        )

    async def health(self) -> dict[str, Any]:
        return self._sync("GET", "/health", lambda: _as_json(self.server.health_info()))
