"""The gateway server: start and stop, routing, auth and session lookup of proxy calls, and the
admin operations (one implementation each, for the HTTP admin routes and LocalGatewayClient).

A proxy call is routed, its session looked up (and its token checked), its body decoded and
validated here; then it goes on the early lane (``proxy_lane``: answered from I/O callbacks,
no task) or the task path (``proxy.Proxy.run``), which open and finish its one trace through
the call ledger (``calls``). Admin routes live in ``admin_routes``.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from rllm.gateway.admin_routes import AdminRoutes
from rllm.gateway.auth import bearer, same_secret, session_denied
from rllm.gateway.calls import CallLedger, ParsedCall
from rllm.gateway.config import GatewayConfig, image_limits
from rllm.gateway.errors import (
    GatewayError,
    answer_or_error,
    error_response,
    gateway_error_response,
)
from rllm.gateway.jsonguard import fits_int64
from rllm.gateway.metrics import GatewayMetrics
from rllm.gateway.proxy import Proxy
from rllm.gateway.proxy_lane import start_exchange
from rllm.gateway.sessions import EndedSessions, Session, SessionRegistry
from rllm.gateway.store import open_store
from rllm.gateway.upstreams import Upstream, UpstreamPool
from rllm.gateway.validation import RequestValidator
from rllm.runtime.background import BackgroundLoop
from rllm.runtime.http_messages import Pending, Request, Response, StreamResponse
from rllm.runtime.http_router import MethodNotAllowed, RouteNotFound, Router
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
        # Partial rollouts continue aborted calls in a task (rllm.gateway.partial), never on the lane.
        self._lane = cfg.fast_http and cfg.proxy_lane and not cfg.partial_rollouts
        self._router = self._build_router()
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
            early=self._early,
        )
        sock = socket.socket(socket.AF_INET6 if ":" in cfg.host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((cfg.host, cfg.port))
        self.port = sock.getsockname()[1]
        sock.setblocking(False)
        await self._server.start(sock, backlog=4096)
        http = self.proxy.http
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

    # ------------------------------------------------------------------ routing
    def _build_router(self) -> Router:
        r = Router()
        for prefix in ("/sessions/{sid}", "/sessions/{sid}/roles/{role}", ""):
            r.add("POST", prefix + "/v1/chat/completions", self._chat)
            r.add("POST", prefix + "/v1/completions", self._completions)
            r.add("GET", prefix + "/v1/models", self._models)
        for method, path, handler in AdminRoutes(self).routes():
            r.add(method, path, handler)
        return r

    async def _dispatch(self, request: Request) -> Response | StreamResponse:
        """Route one request; every failure becomes an OpenAI-style error."""
        return await answer_or_error(request, self._router.dispatch(request, _route_error))

    def answer(self, request: Request) -> Awaitable[Response | StreamResponse]:
        """Answer a request that did not come over TCP (``rllm.gateway.inprocess``): the task path."""
        return self._dispatch(request)

    def _early(self, request: Request) -> Response | Awaitable[Response | StreamResponse] | Pending | None:
        """Proxy calls start here, in the I/O callback that completed the request (HttpServer's
        ``early``): decoded, validated and traced at once, and sent from here when the call can
        go out on an idle kept-alive upstream connection (``proxy_lane``). Streams, hosted
        providers, a paused gateway, https upstreams and every other route go on in a task."""
        if request.method != "POST" or not self._lane:
            return None
        try:
            handler, params = self._router.resolve("POST", request.path)
        except (RouteNotFound, MethodNotAllowed):
            return None
        chat = handler == self._chat
        if not chat and handler != self._completions:
            return None
        request.match_info = params
        t0 = time.perf_counter()
        proxy = self.proxy
        try:
            parsed = self._parse_call(request, chat)
            if (
                parsed.body.get("stream")
                or proxy.hosted is not None
                or not self.ledger.admitting
                or not proxy.plain_http()
            ):
                return answer_or_error(request, proxy.run(request, chat, t0, parsed))
            return start_exchange(proxy, request, chat, t0, parsed)
        except GatewayError as exc:
            return gateway_error_response(exc)

    # ------------------------------------------------------------------ proxy routes (task path)
    async def _chat(self, request: Request) -> Response | StreamResponse:
        t0 = time.perf_counter()
        return await self.proxy.run(request, True, t0, self._parse_call(request, True))

    async def _completions(self, request: Request) -> Response | StreamResponse:
        t0 = time.perf_counter()
        return await self.proxy.run(request, False, t0, self._parse_call(request, False))

    async def _models(self, request: Request) -> Response:
        sid = request.match_info.get("sid")
        if sid is not None or request.headers.get("X-RLLM-Session"):
            self._session_for(request, sid)
        return await self.proxy.list_models()

    def _parse_call(self, request: Request, chat: bool) -> ParsedCall:
        """Session, role, decoded body and validated messages of a proxy call."""
        match = request.match_info
        session = self._session_for(request, match.get("sid"))
        role = match.get("role") or request.headers.get("X-RLLM-Role") or "default"
        body = self.validator.decode(request.body)
        return ParsedCall(session, role, body, self.validator.validate_call(body, chat))

    def _session_for(self, request: Request, sid: str | None) -> Session:
        """The call's session (path, else ``X-RLLM-Session``), its token checked with
        ``session_auth``; created on first use with ``auto_create_sessions``."""
        if sid is None:
            sid = request.headers.get("X-RLLM-Session")
            if not sid:
                raise GatewayError(
                    400,
                    "plain /v1 routes need an X-RLLM-Session header (or use /sessions/{session_id}/v1)",
                    param="X-RLLM-Session",
                    code="missing_session",
                )
        session = self.sessions.get(sid)
        cfg = self.config
        if cfg.session_auth:
            presented = bearer(request)
            if not same_secret(presented, cfg.admin_key):
                # With per-session tokens only the admin brings sessions into being. An unknown
                # session and a wrong token get the same 401, so ids cannot be probed.
                token = session.token if session is not None else self.ended.token_of(sid)
                if not same_secret(presented, token):
                    raise session_denied(sid)
        if session is None:
            if self.ended.token_of(sid) is not None:
                # A call that outlived its flow: re-creating the session would leak it and its
                # traces, since nobody will finish it again.
                raise GatewayError(
                    410,
                    f"session {sid!r} has ended (finished or deleted)",
                    param="session_id",
                    code="session_ended",
                )
            if not cfg.auto_create_sessions:
                raise GatewayError(
                    404, f"unknown session {sid!r}", param="session_id", code="unknown_session"
                )
            session = self.session_registry.new(sid, None, None)
        return session

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

    async def pause(self, timeout_s: float = 600.0) -> None:
        """Stop admitting requests (they wait) and return once in-flight ones have finished (or,
        with ``partial_rollouts``, were aborted and parked with their tokens so far)."""
        abort = self.proxy.abort_upstreams if self.config.partial_rollouts else None
        await self.ledger.pause(timeout_s, abort)

    def resume(self) -> None:
        self.ledger.resume()

    def health_info(self) -> dict[str, Any]:
        return {
            "status": "ok",
            "upstreams": len(self.pool.upstreams),
            "healthy_upstreams": self.pool.healthy_count(),
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
        assert self.proxy.http is not None
        await self.pool.check(self.proxy.http, w, timeout_s=min(2.0, self.config.connect_timeout_s))
        return w

    def remove_upstream(self, url: str) -> str:
        if not self.pool.remove(url):
            raise GatewayError(404, f"unknown upstream {url!r}", param="url")
        return url.rstrip("/")


__all__ = ["GatewayServer"]
