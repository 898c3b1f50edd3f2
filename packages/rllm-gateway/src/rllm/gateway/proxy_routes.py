"""The proxy routes of a gateway: where a call is routed, its session found (and its token
checked), its body decoded and validated, and sent on its way.

A proxy call (``/v1/chat/completions``, ``/v1/completions``, ``/v1/models`` under
``/sessions/{sid}``, ``/sessions/{sid}/roles/{role}``, or plain ``/v1`` with an
``X-RLLM-Session`` header) goes on from here on the early lane (``proxy_lane``: answered from
I/O callbacks, no task) or the task path (``proxy.Proxy.run``), which open and finish its one
trace through the call ledger (``calls``).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable

from rllm.gateway.auth import bearer, same_secret, session_denied
from rllm.gateway.calls import CallLedger, ParsedCall
from rllm.gateway.config import GatewayConfig
from rllm.gateway.errors import GatewayError, answer_or_error, gateway_error_response
from rllm.gateway.policy_routes import route_policy
from rllm.gateway.proxy import Proxy
from rllm.gateway.proxy_lane import start_exchange
from rllm.gateway.sessions import Session, SessionRegistry
from rllm.gateway.validation import RequestValidator
from rllm.runtime.http_messages import Pending, Request, Response, StreamResponse
from rllm.runtime.http_router import MethodNotAllowed, RouteNotFound, Router


class ProxyRoutes:
    """The proxy routes of one gateway, added to its ``router`` (see the module docstring)."""

    def __init__(
        self,
        config: GatewayConfig,
        sessions: SessionRegistry,
        validator: RequestValidator,
        ledger: CallLedger,
        proxy: Proxy,
        router: Router,
    ) -> None:
        self.config = config
        self.sessions = sessions
        self._live, self._ended = sessions.live, sessions.ended
        self.validator = validator
        self.ledger = ledger
        self.proxy = proxy
        self._router = router
        # Partial rollouts continue aborted calls in a task (rllm.gateway.partial), never on the lane.
        self._lane = config.fast_http and config.proxy_lane and not config.partial_rollouts
        for prefix in ("/sessions/{sid}", "/sessions/{sid}/roles/{role}", ""):
            router.add("POST", prefix + "/v1/chat/completions", self.chat)
            router.add("POST", prefix + "/v1/completions", self.completions)
            router.add("GET", prefix + "/v1/models", self.models)

    def early(self, request: Request) -> Response | Awaitable[Response | StreamResponse] | Pending | None:
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
        chat = handler == self.chat
        if not chat and handler != self.completions:
            return None
        request.match_info = params
        t0 = time.perf_counter()
        proxy = self.proxy
        try:
            parsed = self.parse_call(request, chat)
            if (
                parsed.body.get("stream")
                or proxy.hosted is not None
                or not self.ledger.admitting
                or not proxy.sender.plain_http()
            ):
                return answer_or_error(request, proxy.run(request, chat, t0, parsed))
            return start_exchange(proxy, request, chat, t0, parsed)
        except GatewayError as exc:
            return gateway_error_response(exc)

    # ------------------------------------------------------------------ the task path
    async def chat(self, request: Request) -> Response | StreamResponse:
        t0 = time.perf_counter()
        return await self.proxy.run(request, True, t0, self.parse_call(request, True))

    async def completions(self, request: Request) -> Response | StreamResponse:
        t0 = time.perf_counter()
        return await self.proxy.run(request, False, t0, self.parse_call(request, False))

    async def models(self, request: Request) -> Response:
        sid = request.match_info.get("sid")
        if sid is not None or request.headers.get("X-RLLM-Session"):
            self.session_for(request, sid)
        return await self.proxy.list_models()

    def parse_call(self, request: Request, chat: bool) -> ParsedCall:
        """Session, role, decoded body and validated messages of a proxy call."""
        match = request.match_info
        session = self.session_for(request, match.get("sid"))
        role = match.get("role") or request.headers.get("X-RLLM-Role") or "default"
        body = self.validator.decode(request.body)
        messages = self.validator.validate_call(body, chat)
        policy = route_policy(self.config.policies, self.config.roles, role, body)
        return ParsedCall(session, role, body, messages, policy)

    def session_for(self, request: Request, sid: str | None) -> Session:
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
        session = self._live.get(sid)
        cfg = self.config
        if cfg.session_auth:
            presented = bearer(request)
            if not same_secret(presented, cfg.admin_key):
                # With per-session tokens only the admin brings sessions into being. An unknown
                # session and a wrong token get the same 401, so ids cannot be probed.
                token = session.token if session is not None else self._ended.token_of(sid)
                if not same_secret(presented, token):
                    raise session_denied(sid)
        if session is None:
            if self._ended.token_of(sid) is not None:
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
            session = self.sessions.new(sid, None, None)
        return session


__all__ = ["ProxyRoutes"]
