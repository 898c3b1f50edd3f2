"""The gateway HTTP server: session-routed OpenAI-compatible proxy plus admin API.

A lean httptools server (httpserver.py) serves; a lean keep-alive client (fasthttp.py) forwards
whole responses, aiohttp forwards streams; msgspec decodes and encodes JSON. The
request hot path does: auth, decode, validate, inject capture fields, forward, read capture
fields, strip what was injected, encode, append one TraceRecord to the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import re
import socket
import time
from array import array
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
import msgspec

from rllm.gateway.capture import (
    Captured,
    StreamCapture,
    UpstreamShapeError,
    apply_sampling,
    check_captured,
    inject_capture,
    read_answer,
    strip_injected,
)
from rllm.gateway.config import GatewayConfig, image_limits
from rllm.gateway.errors import GatewayError, error_body, error_response
from rllm.gateway.jsonguard import JsonLimitError, check_json, fits_int64
from rllm.gateway.metrics import GatewayMetrics
from rllm.gateway.proxy_lane import ParsedCall, ProxyCall, start_exchange
from rllm.gateway.sessions import EndedSessions, Session
from rllm.gateway.sse import EventTooLarge, SseEvents
from rllm.gateway.store import encodable, open_store
from rllm.gateway.workers import NoHealthyWorker, Worker, WorkerPool
from rllm.runtime.background import BackgroundLoop
from rllm.runtime.http_client import FastHttpPool, UpstreamBadResponse, UpstreamConnectError, UpstreamDropped
from rllm.runtime.http_messages import Pending, Request, Response, StreamResponse
from rllm.runtime.http_router import MethodNotAllowed, RouteNotFound, Router
from rllm.runtime.http_server import HttpServer
from rllm.types import (
    FloatArray,
    FunctionCall,
    Message,
    SamplingParams,
    SchemaError,
    TokenArray,
    ToolCall,
    TraceRecord,
    Usage,
    convert,
    to_builtins,
    to_json,
    to_msgpack,
)
from rllm.types.images import ImageError, check_message_images, intern_images

log = logging.getLogger("rllm.gateway")

_json_decode = msgspec.json.Decoder().decode
_json_encode = msgspec.json.Encoder().encode
_JSON = "application/json"
_MSGPACK = "application/msgpack"
_SESSION_ID_RE = re.compile(r"^[A-Za-z0-9._:@-]{1,200}$")
_T = TypeVar("_T")
_A = TypeVar("_A", bound=array)
_RETRYABLE = (
    aiohttp.ClientConnectorError,
    aiohttp.ServerDisconnectedError,
    aiohttp.ClientOSError,
    ConnectionResetError,
)


class _StreamFault(Exception):
    """What the capture cannot take from an upstream's stream (the message says what)."""


class _UpstreamFailed(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _route_error(status: int, message: str) -> Response:
    return error_response(status, message, code="unknown_route" if status == 404 else None)


class GatewayServer:
    """One gateway: ``await start()``, ``url``, ``await stop()``; or ``start_in_thread()``.

    Several servers may live in one process (tests); each has its own store, metrics
    registry and HTTP client pool.
    """

    def __init__(self, config: GatewayConfig | None = None) -> None:
        self.config = config or GatewayConfig()
        self._image_limits = image_limits(self.config)
        self.store = open_store(self.config.store, batch_ms=self.config.sqlite_batch_ms)
        self.pool = WorkerPool(self.config.upstreams)
        self.sessions: dict[str, Session] = {}
        self.ended = EndedSessions(
            ttl_s=self.config.ended_session_ttl_s, max_entries=self.config.ended_session_max
        )
        self.weight_version = 0
        self.metrics = GatewayMetrics(self)
        self.inflight = 0
        self.waiting = 0  # calls held at the door while paused
        self._admit = asyncio.Event()
        self._drained: asyncio.Event | None = None
        self._http: aiohttp.ClientSession | None = None
        self._server: HttpServer | None = None
        self._router = self._build_router()
        self._health_task: asyncio.Task[None] | None = None
        self._background = BackgroundLoop("rllm-gateway", use_uvloop=True)
        self._bridge: Any = None  # cumulative.TokenBridge, loaded lazily in start()
        self._hosted: Any = None
        self._fast: FastHttpPool | None = None
        self._serving_loop: asyncio.AbstractEventLoop | None = None
        self.port = self.config.port
        self.host = self.config.host
        for row in self.store.load_sessions():
            s = Session.from_row(row)
            s.next_seq = self.store.max_seq(s.session_id) + 1
            self.sessions[s.session_id] = s

    # ------------------------------------------------------------------ lifecycle
    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> GatewayServer:
        cfg = self.config
        self._serving_loop = asyncio.get_running_loop()
        self._admit = asyncio.Event()
        self._admit.set()
        self._http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                limit=0, limit_per_host=cfg.max_connections_per_worker, ttl_dns_cache=None
            ),
            timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=cfg.connect_timeout_s, sock_read=cfg.upstream_timeout_s
            ),
            json_serialize=lambda o: _json_encode(o).decode(),
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
        )
        self._fast = FastHttpPool(
            connect_timeout_s=cfg.connect_timeout_s,
            read_timeout_s=cfg.upstream_timeout_s,
            max_body_bytes=cfg.max_upstream_body_bytes,
        )
        if cfg.tokenizer_mode == "cumulative":
            from rllm.gateway.cumulative import TokenBridge

            self._bridge = TokenBridge.load(cfg.tokenizer_path)  # type: ignore[arg-type]
        if cfg.hosted_model:
            from rllm.gateway.hosted import HostedProvider

            self._hosted = HostedProvider(
                cfg.hosted_model, api_key=cfg.hosted_api_key, api_base=cfg.hosted_api_base
            )
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
        if self.pool.workers:
            await self.pool.check_all(self._http, timeout_s=min(2.0, cfg.connect_timeout_s))
        if cfg.health_interval_s > 0:
            self._health_task = asyncio.create_task(
                self.pool.health_loop(self._http, cfg.health_interval_s, cfg.health_timeout_s)
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
        if self._http is not None:
            await self._http.close()
            self._http = None
        if self._fast is not None:
            self._fast.close()
        await self.store.close()
        self._serving_loop = None

    @property
    def serving_loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop the server runs on (None when stopped); in-process admin calls must use it."""
        return self._serving_loop

    def local_client(self) -> Any:
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
        routes: list[tuple[str, str, Any]] = [
            ("GET", "/sessions/{sid}/traces", self._session_traces),
            ("GET", "/health", self._health),
            ("GET", "/metrics", self._metrics),
            ("POST", "/admin/sessions", self._create_session),
            ("GET", "/admin/sessions", self._list_sessions),
            ("GET", "/admin/sessions/{sid}", self._get_session),
            ("DELETE", "/admin/sessions/{sid}", self._delete_session),
            ("POST", "/admin/sessions/{sid}/finish", self._finish_session),
            ("GET", "/admin/sessions/{sid}/traces", self._session_traces),
            ("GET", "/admin/traces", self._query_traces),
            ("POST", "/admin/flush", self._flush),
            ("GET", "/admin/workers", self._list_workers),
            ("POST", "/admin/workers", self._add_worker),
            ("DELETE", "/admin/workers", self._remove_worker),
            ("GET", "/admin/weight_version", self._get_weight_version),
            ("PUT", "/admin/weight_version", self._set_weight_version),
            ("POST", "/admin/weight_version", self._set_weight_version),
            ("POST", "/admin/pause", self._pause),
            ("POST", "/admin/resume", self._resume),
        ]
        for method, path, handler in routes:
            r.add(method, path, handler)
        return r

    async def _dispatch(self, request: Request) -> Response | StreamResponse:
        """Route one request; every failure becomes an OpenAI-style error."""
        return await self._mapped(request, self._router.dispatch(request, _route_error))

    async def _mapped(
        self, request: Request, answer: Awaitable[Response | StreamResponse]
    ) -> Response | StreamResponse:
        """Map every failure of ``answer`` to an OpenAI-style error: the gateway answers, it never
        crashes."""
        try:
            return await answer
        except GatewayError as exc:
            return error_response(exc.status, exc.message, param=exc.param, code=exc.code)
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception as exc:
            log.exception("internal error on %s", request.path)
            return error_response(500, f"internal gateway error: {type(exc).__name__}: {exc}")

    # ------------------------------------------------------------------ auth
    @staticmethod
    def _bearer(request: Request) -> str | None:
        auth = request.headers.get("Authorization")
        if auth and auth[:7].lower() == "bearer ":
            return auth[7:].strip()
        return request.headers.get("X-API-Key")

    def _is_admin(self, presented: str | None) -> bool:
        key = self.config.admin_key
        return (
            key is not None
            and presented is not None
            and hmac.compare_digest(presented.encode(), key.encode())
        )

    def _require_admin(self, request: Request) -> None:
        if self.config.admin_key is None:
            return
        presented = self._bearer(request)
        if presented is None:
            raise GatewayError(
                401, "admin route needs 'Authorization: Bearer <admin key>'", code="missing_api_key"
            )
        if not self._is_admin(presented):
            raise GatewayError(403, "the API key is not the admin key", code="invalid_api_key")

    def _session_for(self, request: Request, sid: str | None) -> Session:
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
        if self.config.session_auth:
            presented = self._bearer(request)
            if not self._is_admin(presented):
                # With per-session tokens only the admin brings sessions into being. An unknown
                # session and a wrong token get the same 401, so ids cannot be probed.
                token = session.token if session is not None else self.ended.token_of(sid)
                if (
                    token is None
                    or presented is None
                    or not hmac.compare_digest(presented.encode(), token.encode())
                ):
                    raise GatewayError(
                        401, f"invalid or missing token for session {sid!r}", code="invalid_api_key"
                    )
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
            if not self.config.auto_create_sessions:
                raise GatewayError(
                    404, f"unknown session {sid!r}", param="session_id", code="unknown_session"
                )
            session = self._new_session(sid, None, None)
        return session

    def _new_session(
        self, sid: str, sampling: SamplingParams | None, metadata: dict[str, Any] | None
    ) -> Session:
        if not _SESSION_ID_RE.match(sid) or sid in (".", ".."):
            raise GatewayError(
                400, f"invalid session id {sid!r}: use 1-200 of [A-Za-z0-9._:@-]", param="session_id"
            )
        s = Session(sid, sampling=sampling, metadata=metadata)
        self.sessions[sid] = s
        self.store.put_session(s.row())
        return s

    # ------------------------------------------------------------------ proxy routes
    async def _chat(self, request: Request) -> StreamResponse:
        return await self._proxy(request, chat=True)

    async def _completions(self, request: Request) -> StreamResponse:
        return await self._proxy(request, chat=False)

    async def _models(self, request: Request) -> StreamResponse:
        sid = request.match_info.get("sid")
        if sid is not None or request.headers.get("X-RLLM-Session"):
            self._session_for(request, sid)
        if self._hosted is not None:
            data = [{"id": self.config.hosted_model, "object": "model", "owned_by": "hosted"}]
            return Response(body=_json_encode({"object": "list", "data": data}), content_type=_JSON)
        assert self._http is not None
        try:
            w = self.pool.pick(None)
        except NoHealthyWorker as exc:
            raise GatewayError(503, str(exc), code="no_healthy_worker") from None
        try:
            async with self._http.get(f"{w.url}/models") as resp:
                body = await resp.read()
                return Response(status=resp.status, body=body, content_type=_JSON)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise GatewayError(
                502, f"upstream {w.url} failed: {type(exc).__name__}", code="upstream_error"
            ) from None

    def _decode_body(self, raw: bytes, *, whole: bool = False) -> dict[str, Any]:
        """The request's JSON object. ``whole``: every part of it must fit the JSON limits (admin
        bodies, kept as they are); proxy calls check only the parts a trace keeps (_validate)."""
        if not raw:
            raise GatewayError(400, "request body is empty; expected a JSON object", code="invalid_json")
        try:
            body = _json_decode(raw)
        except msgspec.DecodeError as exc:
            raise GatewayError(400, f"malformed JSON in request body: {exc}", code="invalid_json") from None
        except RecursionError:
            raise GatewayError(400, "JSON in request body is nested too deep", code="invalid_json") from None
        if whole or self.config.store_raw:
            self._check_json(body, "")
        if not isinstance(body, dict):
            raise GatewayError(
                400, f"request body must be a JSON object, got {type(body).__name__}", code="invalid_json"
            )
        return body

    def _check_json(self, value: Any, where: str) -> None:
        try:
            check_json(value, self.config.max_json_depth, where)
        except JsonLimitError as exc:
            raise GatewayError(
                400, f"{exc.message} at {exc.path}", param=exc.path, code="invalid_json"
            ) from None

    def _validate(self, body: dict[str, Any], chat: bool) -> list[Message]:
        if "stream" in body and not isinstance(body["stream"], bool):
            raise GatewayError(400, "'stream' must be a boolean", param="stream", code="invalid_type")
        for name, types in (
            ("temperature", (int, float)),
            ("top_p", (int, float)),
            ("max_tokens", (int,)),
            ("n", (int,)),
            ("seed", (int,)),
        ):
            v = body.get(name)
            if v is not None and (not isinstance(v, types) or isinstance(v, bool)):
                raise GatewayError(
                    400, f"'{name}' must be a number, got {type(v).__name__}", param=name, code="invalid_type"
                )
            if type(v) is int and not fits_int64(v):
                raise GatewayError(400, f"'{name}' does not fit in 64 bits", param=name, code="invalid_type")
        if body.get("n", 1) not in (None, 1):
            raise GatewayError(400, "the gateway captures one choice per call: 'n' must be 1", param="n")
        # Free-form parts a trace keeps (tools, a prompt) must be storable: depth and int64 limits.
        # Messages need no walk: converting them to Message admits only strings and typed blocks.
        if chat and body.get("tools"):
            self._check_json(body["tools"], "tools")
        if chat:
            msgs = body.get("messages")
            if not isinstance(msgs, list) or not msgs:
                raise GatewayError(
                    400,
                    "'messages' must be a non-empty list of messages",
                    param="messages",
                    code="invalid_type",
                )
            try:
                messages = convert(msgs, list[Message])
            except SchemaError as exc:
                raise GatewayError(
                    400,
                    f"invalid message: {exc.reason}",
                    param=f"messages{_bracket(exc.path)}",
                    code="invalid_type",
                ) from None
            try:
                check_message_images(messages, self._image_limits)
            except ImageError as exc:
                where = f"messages{exc.field}"
                raise GatewayError(
                    400, f"invalid image at {where}: {exc.reason}", param=where, code="invalid_image"
                ) from None
            return messages
        prompt = body.get("prompt")
        ok = isinstance(prompt, str) or (
            isinstance(prompt, list)
            and prompt
            and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
        )
        if not ok:
            raise GatewayError(
                400,
                "'prompt' must be a string or a non-empty list of token ids",
                param="prompt",
                code="invalid_type",
            )
        if isinstance(prompt, list):
            try:
                array("q").fromlist(prompt)  # C-speed int64 check of every token id
            except OverflowError:
                raise GatewayError(
                    400, "a token id in 'prompt' does not fit in 64 bits", param="prompt", code="invalid_type"
                ) from None
        return []

    def _early(self, request: Request) -> Response | Awaitable[Response | StreamResponse] | Pending | None:
        """Proxy calls start here, in the I/O callback that completed the request (HttpServer's
        ``early``): decoded, validated and traced at once, and when the call can go out on an
        idle kept-alive upstream connection it is sent from here and answered from that
        connection's callback (proxy_lane.ProxyExchange): no task and no event-loop pass between
        the agent's request and the upstream, or between the upstream's answer and the agent.
        Streams, hosted providers, a paused gateway, a cold pool and every other route go on in
        a task as before."""
        if request.method != "POST" or not (self.config.fast_http and self.config.proxy_lane):
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
        try:
            parsed = self._parse_call(request, chat)
            if (
                parsed.body.get("stream")
                or self._hosted is not None
                or not self._admit.is_set()
                or not self._plain_http()
            ):
                return self._mapped(request, self._proxy_parsed(request, chat, t0, parsed))
            return start_exchange(self, request, chat, t0, parsed)
        except GatewayError as exc:
            return error_response(exc.status, exc.message, param=exc.param, code=exc.code)

    async def _proxy(self, request: Request, *, chat: bool) -> StreamResponse:
        """The proxy routes when the early lane is off (``proxy_lane`` or ``fast_http`` False)."""
        t0 = time.perf_counter()
        return await self._proxy_parsed(request, chat, t0, self._parse_call(request, chat))

    def _parse_call(self, request: Request, chat: bool) -> ParsedCall:
        """Session, role, decoded body and validated messages of a proxy call."""
        match = request.match_info
        session = self._session_for(request, match.get("sid"))
        role = match.get("role") or request.headers.get("X-RLLM-Role") or "default"
        body = self._decode_body(request.body)
        return ParsedCall(session, role, body, self._validate(body, chat))

    def _open_trace(self, parsed: ParsedCall, chat: bool) -> TraceRecord:
        """Apply the session's sampling and start the call's trace (its seq is taken here)."""
        session, role, body, messages = parsed
        apply_sampling(body, session.sampling or self.config.default_sampling)
        seq = session.next_seq
        session.next_seq = seq + 1
        images: dict[str, str] = {}
        if chat:
            messages, images = intern_images(messages, session.images)
        trace = TraceRecord(
            session_id=session.session_id,
            role=role,
            seq=seq,
            messages=messages,
            weight_version=self.weight_version,
            model=body.get("model") or "",
            images=images,
        )
        if chat and body.get("tools"):
            trace.metadata["tools"] = body["tools"]
        if not chat:
            trace.metadata["prompt"] = body["prompt"]
        if self.config.store_raw:
            trace.raw_request = dict(body)
        self.inflight += 1  # until _call_ended
        return trace

    def _call_ended(self) -> None:
        self.inflight -= 1
        if self.inflight == 0 and self._drained is not None:
            self._drained.set()

    def _upstream_call(
        self, request: Request, parsed: ParsedCall, trace: TraceRecord, chat: bool, t0: float
    ) -> ProxyCall:
        """Turn the agent's body into what the upstream gets (token bridge, capture fields)."""
        session, role, body, messages = parsed
        bridge = None
        if chat and self._bridge is not None:
            bridge = self._bridge.prepare(session, role, body, messages, trace)
        wants = inject_capture(body, chat=chat and bridge is None, stream=bool(body.get("stream")))
        path = "/chat/completions" if chat and bridge is None else "/completions"
        return ProxyCall(request, session, path, body, wants, trace, t0, chat, bridge)

    async def _proxy_parsed(
        self, request: Request, chat: bool, t0: float, parsed: ParsedCall
    ) -> StreamResponse:
        if not self._admit.is_set():
            self.waiting += 1
            try:
                await self._admit.wait()
            finally:
                self.waiting -= 1
            sid = parsed.session.session_id
            if self.sessions.get(sid) is not parsed.session:
                raise GatewayError(
                    410,
                    f"session {sid!r} ended while the call waited for the gateway to resume",
                    param="session_id",
                    code="session_ended",
                )
        trace = self._open_trace(parsed, chat)
        try:
            stream = bool(parsed.body.get("stream"))
            if self._hosted is not None:
                return await self._hosted_call(request, parsed.body, trace, chat, stream, t0)
            call = self._upstream_call(request, parsed, trace, chat, t0)
            return await (self._forward_stream(call) if stream else self._forward(call))
        finally:
            self._call_ended()

    def _finish_trace(self, trace: TraceRecord, cap: Captured | None, status: str, t0: float) -> None:
        trace.latency_s = time.perf_counter() - t0
        trace.status = status  # type: ignore[assignment]
        if cap is not None:
            fill_trace(trace, cap)
        if trace.session_id in self.sessions:
            self.store.put(trace)
        # else the session was deleted (finished) while this call was in flight: nobody can read
        # the trace any more, and storing it would leak it.
        self.metrics.observe(trace)

    async def _post(
        self, session: Session, path: str, body: dict[str, Any]
    ) -> tuple[Worker, aiohttp.ClientResponse]:
        """POST through aiohttp (streaming, https upstreams), with failover."""
        assert self._http is not None
        http = self._http

        def send(w: Worker) -> Awaitable[aiohttp.ClientResponse]:
            return http.post(w.url + path, data=_json_encode(body), headers={"Content-Type": _JSON})

        return await self._failover(session, body, send, _RETRYABLE, aiohttp.ClientConnectorError)

    async def _post_whole(self, session: Session, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
        """Non-streaming POST through the lean keep-alive client, with failover."""
        assert self._fast is not None
        fast = self._fast
        _, answer = await self._failover(
            session,
            body,
            lambda w: fast.post(w.url + path, _json_encode(body)),
            (UpstreamConnectError, UpstreamDropped, OSError),
            UpstreamConnectError,
        )
        return answer

    async def _failover(
        self,
        session: Session,
        body: dict[str, Any],
        send: Callable[[Worker], Awaitable[_T]],
        retryable: tuple[type[BaseException], ...],
        refused: type[BaseException],
    ) -> tuple[Worker, _T]:
        """Send to the session's worker; retry while nothing has been answered yet.

        A dropped kept-alive connection gets one more try on the same worker (the upstream may
        just have closed it); a refused connection, or a second drop, marks the worker failed
        and moves on to another.
        """
        tried: set[str] = set()
        dropped_once: set[str] = set()
        last_err = ""
        for _ in range(self.config.retries + 2):
            try:
                w = self.pool.pick(session.worker, tried or None)
            except NoHealthyWorker as exc:
                msg = f"{exc}; last error: {last_err}" if last_err else str(exc)
                raise GatewayError(503, msg, code="no_healthy_worker") from None
            session.worker = w.url
            self._set_model(w, body)
            w.inflight += 1
            w.requests += 1
            try:
                answer = await send(w)
                if not w.healthy:
                    self.pool.mark_answered(w)
                return w, answer
            except TimeoutError:  # before the retryable errors: TimeoutError is an OSError
                raise GatewayError(504, f"upstream {w.url} timed out", code="upstream_timeout") from None
            except retryable as exc:
                last_err = f"{w.url}: {type(exc).__name__}: {exc}"
                self.metrics.retries.inc()
                if not isinstance(exc, refused) and w.url not in dropped_once:
                    dropped_once.add(w.url)
                    continue
                self.pool.mark_failed(w, last_err)
                tried.add(w.url)
            finally:
                w.inflight -= 1
        raise GatewayError(
            502, f"all upstream attempts failed; last error: {last_err}", code="upstream_error"
        )

    def _set_model(self, w: Worker, body: dict[str, Any]) -> None:
        # Agents often send a placeholder model name; the worker serves what it serves.
        want = self.config.model_name
        if want is None and w.models and body.get("model") not in w.models:
            want = w.models[0]
        if want is not None:
            body["model"] = want

    async def _forward(self, call: ProxyCall) -> Response:
        try:
            if self.config.fast_http and self._plain_http():
                status, raw = await self._post_whole(call.session, call.path, call.body)
            else:
                w, resp = await self._post(call.session, call.path, call.body)
                w.inflight += 1
                try:
                    raw = await self._read_capped(resp)
                    status = resp.status
                finally:
                    w.inflight -= 1
                    resp.release()
        except GatewayError as exc:
            call.trace.metadata["error"] = exc.message
            self._finish_trace(call.trace, None, "error", call.t0)
            raise
        except TimeoutError:
            call.trace.metadata["error"] = "upstream timeout"
            self._finish_trace(call.trace, None, "error", call.t0)
            raise GatewayError(504, "upstream timed out while answering", code="upstream_timeout") from None
        except UpstreamBadResponse as exc:
            call.trace.metadata["error"] = f"upstream answered wrongly: {exc}"
            self._finish_trace(call.trace, None, "error", call.t0)
            raise GatewayError(502, call.trace.metadata["error"], code="upstream_error") from None
        except (aiohttp.ClientError, OSError) as exc:
            call.trace.metadata["error"] = f"upstream failed mid-response: {type(exc).__name__}: {exc}"
            self._finish_trace(call.trace, None, "error", call.t0)
            raise GatewayError(
                502, f"upstream failed mid-response: {type(exc).__name__}", code="upstream_error"
            ) from None
        except asyncio.CancelledError:
            self._finish_trace(call.trace, None, "abort", call.t0)
            raise
        except Exception as exc:  # a bug: the call still leaves its one honest trace
            self.fail_unfinished(call.trace, call.t0, exc)
            raise
        return self._answer_whole(call, status, raw)

    async def _read_capped(self, resp: aiohttp.ClientResponse) -> bytes:
        """A whole answer through aiohttp, refused (UpstreamBadResponse) past max_upstream_body_bytes."""
        cap = self.config.max_upstream_body_bytes
        if resp.content_length is not None and resp.content_length > cap:
            raise UpstreamBadResponse(
                f"upstream answer of {resp.content_length} bytes exceeds the limit of {cap}"
            )
        parts: list[bytes] = []
        size = 0
        async for piece in resp.content.iter_any():
            size += len(piece)
            if size > cap:
                resp.close()
                raise UpstreamBadResponse(f"upstream answer of {size}+ bytes exceeds the limit of {cap}")
            parts.append(piece)
        return b"".join(parts)

    def fail_unfinished(self, trace: TraceRecord, t0: float, exc: BaseException) -> None:
        """Record ``trace`` as an error unless it was already finished (``latency_s`` is set
        only by _finish_trace): the last line of defence keeps the one-trace-per-call rule."""
        if trace.latency_s == 0.0:
            trace.metadata["error"] = f"internal gateway error: {type(exc).__name__}: {exc}"
            self._finish_trace(trace, None, "error", t0)

    def _plain_http(self) -> bool:
        """Every upstream speaks plain http (the lean client's only protocol)."""
        return not any(u.startswith("https:") for u in self.pool.workers)

    def _answer_whole(self, call: ProxyCall, status: int, raw: bytes) -> Response:
        """The agent's answer from the upstream's whole one; finishes the trace."""
        sid = call.session.session_id
        if self.sessions.get(sid) is not call.session:
            # Its session was finished or deleted while the call was in flight (a flow past its
            # deadline): nobody can read a trace any more, so none is kept, and the agent is told
            # so rather than handed an answer that counts for nothing.
            call.trace.status = "error"
            call.trace.latency_s = time.perf_counter() - call.t0
            self.metrics.observe(call.trace)  # counted, not stored
            raise GatewayError(
                410,
                f"session {sid!r} ended while this call was in flight; its answer was discarded",
                param="session_id",
                code="session_ended",
            )
        if status != 200:
            call.trace.metadata["error"] = raw[:2000].decode(errors="replace")
            call.trace.metadata["upstream_status"] = status
            self._finish_trace(call.trace, None, "error", call.t0)
            return Response(status=status, body=raw, content_type=_JSON)
        try:
            data = _json_decode(raw)
            cap = read_answer(data, chat=call.chat and call.bridge is None)  # checks what is kept
            if self.config.store_raw:  # then the whole answer is kept: it must fit the limits too
                check_json(data, self.config.max_json_depth)
                call.trace.raw_response = dict(data)
            if call.bridge is not None:
                self._bridge.commit(call.session, call.bridge, cap, call.trace)
                data = self._bridge.to_chat(data, cap, call.bridge)
                out = _json_encode(data)
            else:
                out = _json_encode(data) if strip_injected(data, call.wants) else raw
        except (msgspec.DecodeError, RecursionError, JsonLimitError, UpstreamShapeError) as exc:
            why = self._upstream_fault(exc)
            call.trace.metadata["error"] = why
            self._finish_trace(call.trace, None, "error", call.t0)
            raise GatewayError(502, why, code="upstream_error") from None
        self._finish_trace(call.trace, cap, "ok", call.t0)
        return Response(body=out, content_type=_JSON)

    @staticmethod
    def _upstream_fault(exc: BaseException) -> str:
        """One line saying what was wrong with an upstream's answer."""
        if isinstance(exc, msgspec.DecodeError):
            return f"upstream sent malformed JSON: {exc}"
        if isinstance(exc, RecursionError):
            return "upstream answer nested too deep"
        if isinstance(exc, JsonLimitError):
            return f"upstream answer: {exc.message} at {exc.path}"
        return f"upstream answer has the wrong shape: {exc}"

    async def _forward_stream(self, call: ProxyCall) -> StreamResponse:
        sc = StreamCapture(chat=call.chat and call.bridge is None)
        out: StreamResponse | None = None
        try:
            w, resp = await self._post(call.session, call.path, call.body)
        except GatewayError as exc:
            call.trace.metadata["error"] = exc.message
            self._finish_trace(call.trace, None, "error", call.t0)
            raise
        except asyncio.CancelledError:
            self._finish_trace(call.trace, None, "abort", call.t0)
            raise
        w.inflight += 1
        status = "ok"
        try:
            if resp.status != 200:
                raw = await resp.read()
                call.trace.metadata["error"] = raw[:2000].decode(errors="replace")
                call.trace.metadata["upstream_status"] = resp.status
                status = "error"
                return Response(status=resp.status, body=raw, content_type=_JSON)
            out = StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await out.prepare(call.request)
            fault = None
            try:
                if await self._relay_events(call, resp, out, sc):
                    sc.checked_result()
                else:
                    fault = "upstream closed the stream before [DONE]"
            except UpstreamShapeError as exc:
                fault = f"upstream stream has the wrong shape: {exc}"
            except _StreamFault as exc:
                fault = str(exc)
            if fault is not None:
                status = "error"
                call.trace.metadata["error"] = fault
                await out.write(b"data: " + error_body(502, fault) + b"\n\n")
            await out.write(b"data: [DONE]\n\n")
            sc.saw_done = fault is None
            return out
        except asyncio.CancelledError:
            status = "abort"  # the client went away: closing ``resp`` cancels the upstream request
            raise
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            status = "abort"
            raise
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            status = "error"
            if isinstance(exc, TimeoutError):
                why = f"upstream stalled mid-stream (no data for {self.config.upstream_timeout_s}s)"
            else:
                why = f"upstream failed mid-stream: {type(exc).__name__}: {exc}"
            call.trace.metadata["error"] = why
            if out is None:
                if isinstance(exc, TimeoutError):
                    raise GatewayError(504, "upstream timed out", code="upstream_timeout") from None
                raise GatewayError(502, why, code="upstream_error") from None
            # The head went out as 200: the client learns of the failure from an error event.
            with contextlib.suppress(Exception):
                await out.write(b"data: " + error_body(502, why) + b"\n\n")
                await out.write(b"data: [DONE]\n\n")
            return out
        finally:
            w.inflight -= 1
            resp.close()
            cap: Captured | None = sc.result()
            try:
                check_captured(cap)  # type: ignore[arg-type]
            except UpstreamShapeError:
                cap = None
            if call.bridge is not None and status == "ok":
                self._bridge.commit(call.session, call.bridge, cap, call.trace)
            if cap is not None and status == "error" and not cap.completion_ids:
                cap = None
            self._finish_trace(call.trace, cap, status, call.t0)

    async def _relay_events(
        self, call: ProxyCall, resp: aiohttp.ClientResponse, out: StreamResponse, sc: StreamCapture
    ) -> bool:
        """Forward the upstream's SSE events to the client, feeding the capture; True once
        ``[DONE]`` came. Raises _StreamFault (or UpstreamShapeError) for what the capture cannot
        take: an event that is not JSON or is larger than ``max_stream_event_bytes``."""
        events = SseEvents(self.config.max_stream_event_bytes)
        async for piece in resp.content.iter_any():
            try:
                payloads = events.feed(piece)
            except EventTooLarge as exc:
                raise _StreamFault(str(exc)) from None
            for payload in payloads:
                if payload == b"[DONE]":
                    return True
                try:
                    chunk = _json_decode(payload)
                except (msgspec.DecodeError, RecursionError):
                    raise _StreamFault("upstream sent a stream event that is not JSON") from None
                if not isinstance(chunk, dict):
                    raise _StreamFault(f"upstream sent a stream event that is a JSON {type(chunk).__name__}")
                if call.bridge is not None:
                    StreamCapture.feed(sc, chunk)
                    chunk = self._bridge.chunk_to_chat(chunk, call.bridge)
                    payload = _json_encode(chunk)
                else:
                    sc.feed(chunk)
                    if strip_injected(chunk, call.wants):
                        payload = _json_encode(chunk)
                await out.write(b"data: " + payload + b"\n\n")
        return False

    async def _hosted_call(
        self,
        request: Request,
        body: dict[str, Any],
        trace: TraceRecord,
        chat: bool,
        stream: bool,
        t0: float,
    ) -> StreamResponse:
        if not chat:
            raise GatewayError(400, "hosted providers are reached through /v1/chat/completions only")
        try:
            data, cap = await self._hosted.complete(body)
        except asyncio.CancelledError:
            self._finish_trace(trace, None, "abort", t0)
            raise
        except Exception as exc:
            trace.metadata["error"] = f"{type(exc).__name__}: {exc}"
            self._finish_trace(trace, None, "error", t0)
            status = getattr(exc, "status_code", 502)
            raise GatewayError(
                status if isinstance(status, int) and 400 <= status < 600 else 502,
                f"hosted provider failed: {type(exc).__name__}",
                code="upstream_error",
            ) from None
        self._finish_trace(trace, cap, "ok", t0)
        if not stream:
            return Response(body=_json_encode(data), content_type=_JSON)
        from rllm.gateway.hosted import as_sse_chunks

        out = StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await out.prepare(request)
        for chunk in as_sse_chunks(data):
            await out.write(b"data: " + _json_encode(chunk) + b"\n\n")
        await out.write(b"data: [DONE]\n\n")
        return out

    # ------------------------------------------------------------------ admin routes
    async def _health(self, request: Request) -> Response:
        return Response(body=_json_encode(self.health_info()), content_type=_JSON)

    async def _metrics(self, request: Request) -> Response:
        body, ctype = self.metrics.render()
        return Response(body=body, headers={"Content-Type": ctype})

    async def _admin_body(self, request: Request) -> dict[str, Any]:
        if not request.can_read_body:
            return {}
        return self._decode_body(request.body, whole=True)

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
        if session_id is None:
            from rllm.types import new_id

            session_id = new_id()
        if not isinstance(session_id, str):
            raise GatewayError(400, "'session_id' must be a string", param="session_id")
        if sampling is not None and not isinstance(sampling, SamplingParams):
            raise GatewayError(400, "'sampling' must be SamplingParams", param="sampling")
        if metadata is None:
            metadata = {}
        elif not isinstance(metadata, dict):
            raise GatewayError(400, "'metadata' must be an object", param="metadata")
        try:
            check_json(metadata, self.config.max_json_depth, "metadata")
        except JsonLimitError as exc:
            raise GatewayError(400, f"{exc.message} at {exc.path}", param=exc.path) from None
        self.ended.discard(session_id)  # the admin may open an ended id again, on purpose
        existing = self.sessions.get(session_id)
        if existing is not None:
            if sampling is not None:
                existing.sampling = sampling
            existing.metadata.update(metadata)
            self.store.put_session(existing.row())
            return existing
        return self._new_session(session_id, sampling, dict(metadata))

    async def close_session(self, session_id: str) -> int:
        """Delete a session and its traces; how many traces were freed. 404 if it never existed."""
        existed = self._end(session_id)
        n = await self.store.delete_session(session_id)
        if not existed and n == 0:
            raise GatewayError(
                404, f"unknown session {session_id!r}", param="session_id", code="unknown_session"
            )
        return n

    async def finish_session(self, session_id: str) -> list[TraceRecord]:
        """Delete a session and return its traces (ordered by ``seq``): the end of a rollout in one
        step. The session is unregistered first, so a call still in flight for it (a flow past its
        deadline) leaves no trace behind. 404 if the session never existed."""
        existed = self._end(session_id)
        records = await self.store.get(session_id)
        n = await self.store.delete_session(session_id)
        if not existed and n == 0 and not records:
            raise GatewayError(
                404, f"unknown session {session_id!r}", param="session_id", code="unknown_session"
            )
        return records

    def _end(self, session_id: str) -> bool:
        """Unregister a session and remember that it ended; whether it existed."""
        s = self.sessions.pop(session_id, None)
        if s is None:
            return False
        self.ended.add(session_id, s.token)
        return True

    def set_weight_version(self, version: int) -> None:
        """Stamp this version on every trace from now on."""
        if not isinstance(version, int) or isinstance(version, bool) or not fits_int64(version):
            raise GatewayError(
                400, "'weight_version' must be an integer that fits in 64 bits", param="weight_version"
            )
        self.weight_version = version
        self.metrics.weight_version.set(version)

    async def pause(self, timeout_s: float = 600.0) -> None:
        """Stop admitting requests (they wait) and return once in-flight ones have finished."""
        self._admit.clear()
        if self.inflight:
            self._drained = asyncio.Event()
            try:
                await asyncio.wait_for(self._drained.wait(), timeout_s)
            except TimeoutError:
                self._admit.set()  # a failed pause must not leave the gateway paused
                raise GatewayError(
                    504, f"{self.inflight} requests still in flight after {timeout_s}s; not paused"
                ) from None
            finally:
                self._drained = None

    def resume(self) -> None:
        self._admit.set()

    def health_info(self) -> dict[str, Any]:
        return {
            "status": "ok",
            "workers": len(self.pool.workers),
            "healthy_workers": self.pool.healthy_count(),
            "paused": not self._admit.is_set(),
            "inflight": self.inflight,
            "waiting": self.waiting,
            "weight_version": self.weight_version,
        }

    async def add_worker(self, url: str) -> Worker:
        """Add an upstream (checked once right away)."""
        try:
            w = self.pool.add(url)
        except ValueError as exc:
            raise GatewayError(400, str(exc), param="url") from None
        assert self._http is not None
        await self.pool.check(self._http, w, timeout_s=min(2.0, self.config.connect_timeout_s))
        return w

    def remove_worker(self, url: str) -> str:
        if not self.pool.remove(url):
            raise GatewayError(404, f"unknown worker {url!r}", param="url")
        return url.rstrip("/")

    # ------------------------------------------------------------------ admin routes (HTTP)
    async def _create_session(self, request: Request) -> Response:
        self._require_admin(request)
        body = await self._admin_body(request)
        sampling = None
        if body.get("sampling") is not None:
            try:
                sampling = convert(body["sampling"], SamplingParams)
            except SchemaError as exc:
                raise GatewayError(
                    400, f"invalid sampling: {exc.reason}", param=f"sampling.{exc.path}"
                ) from None
        s = self.open_session(body.get("session_id"), sampling, body.get("metadata") or {})
        return Response(body=_json_encode(s.info(self.url, with_token=True)), content_type=_JSON)

    async def _list_sessions(self, request: Request) -> Response:
        self._require_admin(request)
        data = [s.info(self.url, with_token=False) for s in self.sessions.values()]
        return Response(body=_json_encode({"sessions": data}), content_type=_JSON)

    def _existing(self, sid: str) -> Session:
        s = self.sessions.get(sid)
        if s is None:
            raise GatewayError(404, f"unknown session {sid!r}", param="session_id", code="unknown_session")
        return s

    async def _get_session(self, request: Request) -> Response:
        self._require_admin(request)
        s = self._existing(request.match_info["sid"])
        return Response(body=_json_encode(s.info(self.url, with_token=False)), content_type=_JSON)

    async def _delete_session(self, request: Request) -> Response:
        self._require_admin(request)
        sid = request.match_info["sid"]
        n = await self.close_session(sid)
        return Response(body=_json_encode({"deleted": sid, "traces": n}), content_type=_JSON)

    async def _finish_session(self, request: Request) -> Response:
        self._require_admin(request)
        return _records_response(request, await self.finish_session(request.match_info["sid"]))

    async def _session_traces(self, request: Request) -> Response:
        sid = request.match_info["sid"]
        if request.path.startswith("/admin/"):
            self._require_admin(request)
        else:
            # An agent may read its own session with its token; the admin may read any.
            s = self.sessions.get(sid)
            presented = self._bearer(request)
            guarded = self.config.session_auth or self.config.admin_key is not None
            if guarded and not self._is_admin(presented):  # noqa: SIM102 - reads better as two steps
                if s is None or presented is None or not s.token_matches(presented):
                    raise GatewayError(
                        401, f"invalid or missing token for session {sid!r}", code="invalid_api_key"
                    )
        role = request.query.get("role")
        records = await self.store.get(sid)
        if role is not None:
            records = [r for r in records if r.role == role]
        return _records_response(request, records)

    async def _query_traces(self, request: Request) -> Response:
        self._require_admin(request)
        q = request.query
        try:
            since = float(q["since"]) if "since" in q else None
            limit = int(q["limit"]) if "limit" in q else None
        except ValueError:
            raise GatewayError(400, "'since' must be a number and 'limit' an integer") from None
        records = await self.store.query(
            session_id=q.get("session_id"), role=q.get("role"), since=since, limit=limit
        )
        return _records_response(request, records)

    async def _flush(self, request: Request) -> Response:
        self._require_admin(request)
        await self.store.flush()
        return Response(
            body=_json_encode({"flushed": True, "traces": self.store.trace_count()}), content_type=_JSON
        )

    async def _list_workers(self, request: Request) -> Response:
        self._require_admin(request)
        data = [w.info() for w in self.pool.workers.values()]
        return Response(body=_json_encode({"workers": data}), content_type=_JSON)

    async def _worker_url(self, request: Request) -> str:
        body = await self._admin_body(request)
        url = body.get("url") or request.query.get("url")
        if not isinstance(url, str) or not url:
            raise GatewayError(400, "'url' (an upstream base URL ending in /v1) is required", param="url")
        return url

    async def _add_worker(self, request: Request) -> Response:
        self._require_admin(request)
        w = await self.add_worker(await self._worker_url(request))
        return Response(body=_json_encode(w.info()), content_type=_JSON)

    async def _remove_worker(self, request: Request) -> Response:
        self._require_admin(request)
        removed = self.remove_worker(await self._worker_url(request))
        return Response(body=_json_encode({"removed": removed}), content_type=_JSON)

    async def _get_weight_version(self, request: Request) -> Response:
        self._require_admin(request)
        return Response(body=_json_encode({"weight_version": self.weight_version}), content_type=_JSON)

    async def _set_weight_version(self, request: Request) -> Response:
        self._require_admin(request)
        body = await self._admin_body(request)
        v = body.get("weight_version")
        self.set_weight_version(v)  # type: ignore[arg-type] - validated there
        return Response(body=_json_encode({"weight_version": v}), content_type=_JSON)

    async def _pause(self, request: Request) -> Response:
        """Stop admitting requests (they wait) and return once in-flight ones have finished."""
        self._require_admin(request)
        try:
            timeout = float(request.query.get("timeout", "600"))
        except ValueError:
            raise GatewayError(400, "'timeout' must be a number of seconds", param="timeout") from None
        await self.pause(timeout)
        return Response(body=_json_encode({"paused": True, "inflight": self.inflight}), content_type=_JSON)

    async def _resume(self, request: Request) -> Response:
        self._require_admin(request)
        self.resume()
        return Response(body=_json_encode({"paused": False}), content_type=_JSON)


def _bracket(path: str) -> str:
    # "[2].content" -> "[2].content"; "" -> ""
    return path if path.startswith("[") or not path else f".{path}"


def _records_response(request: Request, records: list[TraceRecord]) -> Response:
    fmt = request.query.get("format")
    as_msgpack = fmt == "msgpack" or (fmt is None and _MSGPACK in request.headers.get("Accept", ""))
    encode, ctype = (to_msgpack, _MSGPACK) if as_msgpack else (to_json, _JSON)
    try:
        body = encode(records)
    except (OverflowError, RecursionError, TypeError, ValueError):
        body = encode(encodable(records))  # the store can always be read
    return Response(body=body, content_type=ctype)


def fill_trace(trace: TraceRecord, cap: Captured) -> None:
    """Copy what was captured into the trace, tolerating upstreams that omit parts."""
    if cap.model:
        trace.model = cap.model
    tool_calls = None
    if cap.tool_calls:
        try:
            tool_calls = [
                ToolCall(
                    id=str(tc.get("id") or f"call_{i}"),
                    function=FunctionCall(
                        name=_text(tc["function"]["name"]),
                        arguments=_text(tc["function"].get("arguments") or "{}"),
                    ),
                )
                for i, tc in enumerate(cap.tool_calls)
            ]
        except (KeyError, TypeError, AttributeError):
            trace.metadata["capture_warning"] = "unreadable tool_calls"
    trace.response = Message(
        role="assistant", content=cap.text or None, tool_calls=tool_calls, reasoning=cap.reasoning or None
    )
    trace.finish_reason = cap.finish_reason
    ids = cap.completion_ids
    lps = cap.logprobs
    if cap.prompt_ids is not None:
        trace.prompt_ids = _tokens(cap.prompt_ids)
    if ids:
        trace.completion_ids = _tokens(ids)
        if lps and len(lps) == len(ids):
            trace.logprobs = _packed(FloatArray, "f", lps)
        elif lps:
            trace.metadata["capture_warning"] = f"{len(lps)} logprobs for {len(ids)} tokens; logprobs dropped"
    u = cap.usage
    if isinstance(u, dict):
        trace.usage = Usage(
            prompt_tokens=u.get("prompt_tokens") or 0,
            completion_tokens=u.get("completion_tokens") or 0,
            total_tokens=u.get("total_tokens") or 0,
        )
    elif trace.prompt_ids is not None or trace.completion_ids is not None:
        p = len(trace.prompt_ids or ())
        c = len(trace.completion_ids or ())
        trace.usage = Usage(prompt_tokens=p, completion_tokens=c, total_tokens=p + c)


def _text(value: Any) -> str:
    # A trace holds what it can encode: anything but a string here is an unreadable tool call.
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def _tokens(ids: list[int]) -> Any:
    return _packed(TokenArray, "i", ids)


def _packed(cls: type[_A], typecode: str, values: Any) -> _A:
    # array.fromlist is about 2.5x faster than the generic extend() the constructors use; it
    # only takes a list (what JSON decoding gives), so anything else goes through cls(values).
    if type(values) is list:
        out = array.__new__(cls, typecode)
        out.fromlist(values)
        return out
    return cls(values)


__all__ = ["GatewayServer", "fill_trace", "to_builtins"]
