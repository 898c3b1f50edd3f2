"""GatewayAdmin: the gateway's admin API as one typed interface, and what its implementations
share (``SessionInfo``, ``GatewayAPIError``, ``session_base_url``).

Three implementations: ``GatewayClient`` (over HTTP, any process), ``LocalGatewayClient``
(direct calls into a ``GatewayServer`` on the same event loop) and ``GatewayGroup`` (several
gateways acting as one, e.g. one per engine worker process). Code that drives a gateway (the
engine, a trainer) is written against ``GatewayAdmin`` and works with any of them. Errors are
``GatewayAPIError`` with the HTTP status and error code the admin route answers.
"""

from __future__ import annotations

from typing import Any, Protocol, Self, runtime_checkable

import msgspec

from rllm.gateway.trace_query import ALL_TRACES, TraceQuery
from rllm.types import SamplingParams, TraceRecord
from rllm.types.errors import RLLMError


def session_base_url(gateway_url: str, session_id: str, role: str | None = None) -> str:
    """``{gateway}/sessions/{sid}/v1``, or ``.../roles/{role}/v1`` for one role of a multi-role flow."""
    if role is None:
        return f"{gateway_url}/sessions/{session_id}/v1"
    return f"{gateway_url}/sessions/{session_id}/roles/{role}/v1"


class SessionInfo(msgspec.Struct):
    """What creating a session returns: its id, its token (the agent's api_key) and its base URL."""

    session_id: str
    token: str
    base_url: str


class GatewayAPIError(RLLMError, RuntimeError):
    """The gateway answered an admin call with an error: its HTTP status, OpenAI-style message
    and error ``code`` (e.g. ``unknown_session``; the status as text where the route names none)."""

    def __init__(self, status: int, message: str, method: str, path: str, code: str | None = None) -> None:
        super().__init__(f"{method} {path} -> {status}: {message}")
        self.status = status
        self.message = message
        self.code = code if code is not None else str(status)


@runtime_checkable
class GatewayAdmin(Protocol):
    """The admin operations of a gateway (or of a group of gateways acting as one)."""

    @property
    def url(self) -> str:
        """The gateway's base URL (a group's: its first gateway's)."""
        ...

    def session_url(self, session_id: str, role: str | None = None) -> str:
        """The OpenAI base URL an agent should use for this session (and role)."""
        ...

    async def create_session(
        self,
        session_id: str | None = None,
        sampling: SamplingParams | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> SessionInfo:
        """Create a session (a new id when none is given), or update an existing one."""
        ...

    async def list_sessions(self) -> list[dict[str, Any]]:
        """Every open session (without tokens)."""
        ...

    async def delete_session(self, session_id: str) -> int:
        """Delete a session and its traces; how many traces were freed (404 if unknown)."""
        ...

    async def finish_session(self, session_id: str) -> list[TraceRecord]:
        """Delete a session and return its traces ordered by ``seq`` (404 if unknown)."""
        ...

    async def get_traces(self, session_id: str, role: str | None = None) -> list[TraceRecord]:
        """The session's traces ordered by ``seq`` (none for an unknown session)."""
        ...

    async def query_traces(self, query: TraceQuery = ALL_TRACES) -> list[TraceRecord]:
        """Traces matching every filter given, ordered by creation time."""
        ...

    async def flush(self) -> None:
        """Wait until every trace captured so far is committed to the store."""
        ...

    async def get_weight_version(self) -> int: ...

    async def set_weight_version(self, version: int) -> None:
        """Stamp this version on every trace from now on."""
        ...

    async def set_policy_models(self, models: dict[str, str]) -> None:
        """Each policy's served model name from now on (a run that trains several)."""
        ...

    async def pause(self, timeout_s: float = 600.0) -> None:
        """Stop admitting new requests (they wait) and return once in-flight ones have drained."""
        ...

    async def resume(self) -> None: ...

    async def add_upstream(self, url: str) -> dict[str, Any]:
        """Add an upstream inference server; its state as ``list_upstreams`` shows it."""
        ...

    async def remove_upstream(self, url: str) -> None: ...

    async def list_upstreams(self) -> list[dict[str, Any]]:
        """The upstream inference servers with their health."""
        ...

    async def health(self) -> dict[str, Any]:
        """Liveness, upstream health, admission and the weight version."""
        ...

    async def close(self) -> None:
        """Release the client's connections (the gateway keeps running)."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc: object) -> None:
        """``close()``."""
        ...


__all__ = ["GatewayAPIError", "GatewayAdmin", "SessionInfo", "session_base_url"]
