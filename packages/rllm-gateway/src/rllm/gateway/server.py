"""The gateway server: its parts put together, start and stop, and the admin operations (one
implementation each, for the HTTP admin routes and LocalGatewayClient).

Proxy calls are routed, their sessions looked up (and tokens checked) and their bodies decoded
and validated in ``proxy_routes``; the admin routes live in ``admin_routes``. Both know the
server only as ``rllm.gateway.ports.GatewayOps`` (and the metrics as
``rllm.gateway.metrics.MeteredGateway``), so none of them imports this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from rllm.gateway.admin_routes import AdminRoutes
from rllm.gateway.calls import CallLedger
from rllm.gateway.config import GatewayConfig, image_limits
from rllm.gateway.errors import GatewayError, answer_or_error, error_response
from rllm.gateway.jsonguard import fits_int64
from rllm.gateway.metrics import GatewayMetrics
from rllm.gateway.proxy import Proxy
from rllm.gateway.proxy_routes import ProxyRoutes
from rllm.gateway.sessions import EndedSessions, Session, SessionRegistry
from rllm.gateway.store import open_store
from rllm.gateway.upstreams import Upstream, UpstreamPool
from rllm.gateway.validation import RequestValidator
from rllm.runtime.background import BackgroundLoop
from rllm.runtime.http_messages import Request, Response, StreamResponse
from rllm.runtime.http_router import Router
from rllm.runtime.http_server import HttpServer
from rllm.types import SamplingParams, TraceRecord

if TYPE_CHECKING:
    from rllm.gateway.local_client import LocalGatewayClient


def _route_error(status: int, message: str) -> Response:
    return error_response(status, message, code="unknown_route" if status == 404 else None)


class GatewayServer:
    """One gateway: ``await start()``, ``url``, ``await stop()``; or ``start_in_thread()``.

    Several servers may live in one process (tests); each has its own store, metrics
    registry and HTTP client pool.
    """

    def __init__(self, config: GatewayConfig | None = None) -> None:
        self.config = cfg = config or GatewayConfig()
        self.store = open_store(cfg.store, batch_ms=cfg.sqlite_batch_ms)
        self.pool = UpstreamPool(cfg.upstreams)
        self.session_registry = SessionRegistry(
            self.store,
            ended=EndedSessions(ttl_s=cfg.ended_session_ttl_s, max_entries=cfg.ended_session_max),
            max_json_depth=cfg.max_json_depth,
        )
        self.sessions: dict[str, Session] = self.session_registry.live
        self.ended = self.session_registry.ended
        self.validator = RequestValidator(
            max_json_depth=cfg.max_json_depth, image_limits=image_limits(cfg), store_raw=cfg.store_raw
        )
        self.metrics = GatewayMetrics(self)
        self.ledger = CallLedger(
            sessions=self.sessions,
            store=self.store,
            metrics=self.metrics,
            store_raw=cfg.store_raw,
            default_sampling=cfg.default_sampling,
        )
        self.proxy = Proxy(cfg, self.pool, self.ledger)
        self._router = Router()
        self.proxy_routes = ProxyRoutes(
            cfg, self.session_registry, self.validator, self.ledger, self.proxy, self._router
        )
        for method, path, handler in AdminRoutes(self).routes():
            self._router.add(method, path, handler)
        self._server: HttpServer | None = None
        self._health_task: asyncio.Task[None] | None = None
        self._background = BackgroundLoop("rllm-gateway", use_uvloop=True)
        self._serving_loop: asyncio.AbstractEventLoop | None = None
        self.port = cfg.port
        self.host = cfg.host

    # ------------------------------------------------------------------ lifecycle
    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def serving_loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop the server runs on (None when stopped); in-process admin calls must use it."""
        return self._serving_loop

    @property
    def http_server(self) -> HttpServer | None:
        """The HTTP server answering requests (its ``connections``), None when stopped."""
        return self._server

    @property
    def inflight(self) -> int:
        """Calls accepted and not yet answered."""
        return self.ledger.inflight

    @property
    def waiting(self) -> int:
        """Calls held at the door while the gateway is paused."""
        return self.ledger.waiting

    @property
    def weight_version(self) -> int:
        """The version stamped on every trace from now on (``set_weight_version``)."""
        return self.ledger.weight_version

    async def start(self) -> GatewayServer:
        cfg = self.config
        self._serving_loop = asyncio.get_running_loop()
        self.ledger.admit_all()
        await self.proxy.open()
        self._server = HttpServer(
            self._dispatch,
            lambda status, msg: error_response(status, msg),
            max_body_bytes=cfg.max_body_bytes,
            max_pipelined_bytes=cfg.max_pipelined_bytes,
            early=self.proxy_routes.early,
        )
        sock = socket.socket(socket.AF_INET6 if ":" in cfg.host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((cfg.host, cfg.port))
        self.port = sock.getsockname()[1]
        sock.setblocking(False)
        await self._server.start(sock, backlog=4096)
        http = self.proxy.sender.http
        assert http is not None
        if self.pool.upstreams:
            await self.pool.check_all(http, timeout_s=min(2.0, cfg.connect_timeout_s))
        if cfg.health_interval_s > 0:
            self._health_task = asyncio.create_task(
                self.pool.health_loop(http, cfg.health_interval_s, cfg.health_timeout_s)
            )
        return self

    async def stop(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(BaseException):
                await self._health_task
            self._health_task = None
        if self._server is not None:
            await self._server.stop(self.config.shutdown_timeout_s)
            self._server = None
        await self.proxy.close()
        await self.store.close()
        self._serving_loop = None

    def local_client(self) -> LocalGatewayClient:
        """An in-process admin client (same async API as GatewayClient, no HTTP): for the code
        that owns this server and runs on its event loop, e.g. an engine that embeds its gateway."""
        from rllm.gateway.local_client import LocalGatewayClient

        return LocalGatewayClient(self)

    async def __aenter__(self) -> GatewayServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def start_in_thread(self) -> GatewayServer:
        """Serve from a private event loop in a daemon thread, for synchronous callers."""
        self._background.start(self.start, self.stop)
        return self

    def stop_in_thread(self) -> None:
        self._background.stop()

    # ------------------------------------------------------------------ answering
    async def _dispatch(self, request: Request) -> Response | StreamResponse:
        """Route one request; every failure becomes an OpenAI-style error."""
        return await answer_or_error(request, self._router.dispatch(request, _route_error))

    def answer(self, request: Request) -> Awaitable[Response | StreamResponse]:
        """Answer a request that did not come over TCP (``rllm.gateway.inprocess``): the task path."""
        return self._dispatch(request)

    # ------------------------------------------------------------------ admin operations
    # One implementation each, shared by the HTTP admin routes and LocalGatewayClient. They raise
    # GatewayError (status + message) on bad input.
    def open_session(
        self,
        session_id: str | None = None,
        sampling: SamplingParams | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Session:
        """Create a session, or update an existing one's sampling and metadata."""
        return self.session_registry.open(session_id, sampling, metadata)

    async def close_session(self, session_id: str) -> int:
        """Delete a session and its traces; how many traces were freed. 404 if it never existed."""
        return await self.session_registry.close(session_id)

    async def finish_session(self, session_id: str) -> list[TraceRecord]:
        """Delete a session and return its traces (ordered by ``seq``): the end of a rollout in one
        step. The session is unregistered first, so a call still in flight for it (a flow past its
        deadline) leaves no trace behind. 404 if the session never existed."""
        return await self.session_registry.finish(session_id)

    def set_weight_version(self, version: int) -> None:
        """Stamp this version on every trace from now on."""
        if not isinstance(version, int) or isinstance(version, bool) or not fits_int64(version):
            raise GatewayError(
                400, "'weight_version' must be an integer that fits in 64 bits", param="weight_version"
            )
        self.ledger.weight_version = version
        self.metrics.weight_version.set(version)

    def set_policy_models(self, models: dict[str, str]) -> None:
        """Each policy's served model name from now on (rllm.gateway.policy_routes): a backend
        that serves every synced checkpoint under a new name (remote Tinker) renames them after
        each sync. The policies are the gateway's own; another set is a 400 naming it."""
        if not isinstance(models, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and v for k, v in models.items()
        ):
            raise GatewayError(400, "'policies' must map each policy to its model name", param="policies")
        if sorted(models) != sorted(self.config.policies):
            raise GatewayError(
                400,
                f"'policies' names {', '.join(sorted(models)) or 'none'}; this gateway routes "
                f"{', '.join(sorted(self.config.policies)) or 'none'}",
                param="policies",
            )
        self.config.policies = dict(models)  # the proxy routes by this config (the same object)

    async def pause(self, timeout_s: float = 600.0) -> None:
        """Stop admitting requests (they wait) and return once in-flight ones have finished (or,
        with ``partial_rollouts``, were aborted and parked with their tokens so far)."""
        abort = self.proxy.sender.abort_upstreams if self.config.partial_rollouts else None
        await self.ledger.pause(timeout_s, abort)

    def resume(self) -> None:
        self.ledger.resume()

    def health_info(self) -> dict[str, Any]:
        """Liveness and what model calls can reach: ``status`` is "ok" only when some upstream
        is healthy (or a hosted model serves the calls); otherwise "unavailable", with the
        ``reason`` (``GET /health`` then answers 503)."""
        total, healthy = len(self.pool.upstreams), self.pool.healthy_count()
        reason = None
        if not self.config.hosted_model:
            if not total:
                reason = "no upstream: model calls answer 503 until one is added (POST /admin/upstreams)"
            elif not healthy:
                reason = f"0 of {total} upstreams healthy: model calls answer 503 until one answers"
        return {
            "status": "ok" if reason is None else "unavailable",
            **({"reason": reason} if reason else {}),
            "upstreams": total,
            "healthy_upstreams": healthy,
            "paused": not self.ledger.admitting,
            "inflight": self.ledger.inflight,
            "waiting": self.ledger.waiting,
            "parked": self.ledger.parked,
            "weight_version": self.ledger.weight_version,
        }

    async def add_upstream(self, url: str) -> Upstream:
        """Add an upstream (checked once right away)."""
        try:
            w = self.pool.add(url)
        except ValueError as exc:
            raise GatewayError(400, str(exc), param="url") from None
        http = self.proxy.sender.http
        assert http is not None
        await self.pool.check(http, w, timeout_s=min(2.0, self.config.connect_timeout_s))
        return w

    def remove_upstream(self, url: str) -> str:
        if not self.pool.remove(url):
            raise GatewayError(404, f"unknown upstream {url!r}", param="url")
        return url.rstrip("/")


__all__ = ["GatewayServer"]
