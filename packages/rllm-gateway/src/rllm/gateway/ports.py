"""The interfaces by which the gateway's helpers call back into the proxy and the server.

The helpers that ``Proxy`` and ``GatewayServer`` are built from need some of their owner back:
a stream relay sends through the proxy's sender and finishes traces in its ledger; an admin
route calls the server's admin operations. Were they to import the concrete class, which imports
them, the modules would form an import cycle (``TYPE_CHECKING`` imports included), and none of
them could be read, tested or changed alone. They depend on these protocols instead, which name
only what they use; ``Proxy`` and ``GatewayServer`` satisfy them structurally. An import-linter
contract in the root ``pyproject.toml`` keeps the gateway's import graph acyclic. (The metrics'
gauges read their gateway through ``rllm.gateway.metrics.MeteredGateway``, next to them.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Mapping

    from rllm.gateway.calls import CallLedger, ParsedCall, ProxyCall
    from rllm.gateway.config import GatewayConfig
    from rllm.gateway.cumulative import TokenBridge
    from rllm.gateway.metrics import GatewayMetrics
    from rllm.gateway.sending import UpstreamSender
    from rllm.gateway.sessions import Session, SessionRegistry
    from rllm.gateway.store import TraceStore
    from rllm.gateway.upstreams import Upstream, UpstreamPool
    from rllm.gateway.validation import RequestValidator
    from rllm.runtime.http_messages import Request, Response
    from rllm.types import SamplingParams, TraceRecord


class ProxyPort(Protocol):
    """The proxy as ``streaming``, ``partial``, ``partial_stream`` and ``proxy_lane`` use it
    (``rllm.gateway.proxy.Proxy`` is the implementation)."""

    @property
    def config(self) -> GatewayConfig: ...

    @property
    def ledger(self) -> CallLedger:
        """Opens and finishes each call's one trace; admission."""
        ...

    @property
    def sender(self) -> UpstreamSender:
        """Routes and sends to the upstreams, with failover."""
        ...

    @property
    def bridge(self) -> TokenBridge | None:
        """Cumulative mode's token bridge (None in plain mode)."""
        ...

    def upstream_call(
        self, request: Request, parsed: ParsedCall, trace: TraceRecord, chat: bool, t0: float
    ) -> ProxyCall:
        """The agent's body turned into what the upstream gets."""
        ...

    async def forward(self, call: ProxyCall) -> Response:
        """Send a whole call with failover and answer it."""
        ...

    def answer_whole(self, call: ProxyCall, status: int, raw: bytes) -> Response:
        """The agent's answer from the upstream's whole one; finishes the trace."""
        ...


class GatewayOps(Protocol):
    """A gateway server as its HTTP admin routes (``admin_routes``) and its in-process admin
    client (``local_client``) use it: what it holds, and its admin operations, one
    implementation each (``rllm.gateway.server.GatewayServer`` is the implementation)."""

    @property
    def url(self) -> str: ...

    @property
    def config(self) -> GatewayConfig: ...

    @property
    def serving_loop(self) -> asyncio.AbstractEventLoop | None: ...

    @property
    def validator(self) -> RequestValidator: ...

    @property
    def metrics(self) -> GatewayMetrics: ...

    @property
    def sessions(self) -> Mapping[str, Session]: ...

    @property
    def session_registry(self) -> SessionRegistry: ...

    @property
    def store(self) -> TraceStore: ...

    @property
    def pool(self) -> UpstreamPool: ...

    @property
    def weight_version(self) -> int: ...

    @property
    def inflight(self) -> int: ...

    def open_session(
        self,
        session_id: str | None = None,
        sampling: SamplingParams | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Session: ...

    async def close_session(self, session_id: str) -> int: ...

    async def finish_session(self, session_id: str) -> list[TraceRecord]: ...

    def set_weight_version(self, version: int) -> None: ...

    def set_policy_models(self, models: dict[str, str]) -> None: ...

    async def pause(self, timeout_s: float = 600.0) -> None: ...

    def resume(self) -> None: ...

    def health_info(self) -> dict[str, Any]: ...

    async def add_upstream(self, url: str) -> Upstream: ...

    def remove_upstream(self, url: str) -> str: ...


__all__ = ["GatewayOps", "ProxyPort"]
