"""The gateway's early lane: a non-streaming proxy call answered without a task.

Under load every hop through the event loop's ready queue waits behind everything else that
became ready in the same pass, and a proxied call through a task costs two such hops more than
the agent's own HTTP client does: the handler task's first step after the request arrives, and
its wake-up after the upstream's answer. Here the request is decoded, traced and written to an
idle kept-alive upstream connection from the I/O callback that completed it, and the answer is
captured and written back to the agent from the I/O callback that completed the upstream's
response. Whatever does not fit (no idle connection, a dropped connection) goes on in a task
through the gateway's ordinary failover path, with the same trace.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec

from rllm.gateway.capture import ClientWants
from rllm.gateway.errors import GatewayError, error_response
from rllm.gateway.sessions import Session
from rllm.gateway.workers import NoHealthyWorker, Worker
from rllm.runtime.http_client import Connection, Outcome, UpstreamBadResponse
from rllm.runtime.http_messages import Request, Response, StreamResponse
from rllm.types import Message, TraceRecord

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from rllm.gateway.server import GatewayServer

log = logging.getLogger("rllm.gateway")
_json_encode = msgspec.json.Encoder().encode


class ParsedCall(NamedTuple):
    """A proxy call's request, decoded and validated: nothing sent, no trace yet."""

    session: Session
    role: str
    body: dict[str, Any]
    messages: list[Message]


@dataclass(slots=True)
class ProxyCall:
    """One proxied call once its trace is open: what forwarding it and answering it need."""

    request: Request
    session: Session
    path: str  # on the upstream
    body: dict[str, Any]  # as sent upstream (sampling applied, capture fields injected)
    wants: ClientWants
    trace: TraceRecord
    t0: float
    chat: bool
    bridge: Any  # the cumulative token bridge's plan, or None


def start_exchange(
    server: GatewayServer, request: Request, chat: bool, t0: float, parsed: ParsedCall
) -> ProxyExchange | Awaitable[Response | StreamResponse]:
    """Open the call's trace and send it upstream now if a kept-alive connection is idle
    (returns the pending exchange), else return the task path's awaitable for it."""
    session, body = parsed.session, parsed.body
    trace = server._open_trace(parsed, chat)
    try:
        call = server._upstream_call(request, parsed, trace, chat, t0)
    except BaseException:
        server._call_ended()
        raise
    exchange = ProxyExchange(server, call)
    try:
        w = server.pool.pick(session.worker)
    except NoHealthyWorker:
        return exchange.in_task()  # the failover path answers 503 and records the error
    session.worker = w.url
    server._set_model(w, body)
    assert server._fast is not None
    conn = server._fast.send_nowait(w.url + call.path, _json_encode(body), exchange.on_answer)
    if conn is None:
        return exchange.in_task()
    exchange.sent(w, conn)
    return exchange


class ProxyExchange:
    """One call in flight on the early lane; the connection's ``cancel()`` target while it is."""

    __slots__ = ("call", "conn", "server", "worker")

    def __init__(self, server: GatewayServer, call: ProxyCall) -> None:
        self.server = server
        self.call = call
        self.worker: Worker | None = None
        self.conn: Connection | None = None

    def sent(self, worker: Worker, conn: Connection) -> None:
        self.worker, self.conn = worker, conn
        worker.inflight += 1
        worker.requests += 1

    def in_task(self) -> Awaitable[Response | StreamResponse]:
        """The rest of the call through the gateway's failover path, as a task would run it."""
        server = self.server

        async def forward() -> Response:
            try:
                return await server._forward(self.call)
            finally:
                server._call_ended()

        return server._mapped(self.call.request, forward())

    def on_answer(self, outcome: Outcome) -> None:
        """The upstream connection's callback: answer the agent now (or retry in a task)."""
        server, w, call = self.server, self.worker, self.call
        assert w is not None
        w.inflight -= 1
        self.conn = None
        if isinstance(outcome, TimeoutError):
            self._fail(GatewayError(504, f"upstream {w.url} timed out", code="upstream_timeout"))
            return
        if isinstance(outcome, UpstreamBadResponse):  # retrying would get the same answer
            self._fail(GatewayError(502, f"upstream answered wrongly: {outcome}", code="upstream_error"))
            return
        if isinstance(outcome, BaseException):
            # A kept-alive connection the upstream had closed (or that died mid-answer): the
            # failover path retries it, on the same worker first.
            server.metrics.retries.inc()
            call.request.respond_later(self.in_task())
            return
        status, raw = outcome
        if not w.healthy:
            server.pool.mark_answered(w)
        try:
            resp = server._answer_whole(call, status, raw)
        except GatewayError as exc:  # _answer_whole finished the trace
            resp = error_response(exc.status, exc.message, param=exc.param, code=exc.code)
        except Exception as exc:  # a bug: answer anyway, as the task path's last line of defence
            log.exception("internal error on %s", call.request.path)
            server.fail_unfinished(call.trace, call.t0, exc)
            resp = error_response(500, f"internal gateway error: {type(exc).__name__}: {exc}")
        server._call_ended()
        call.request.respond(resp)

    def _fail(self, exc: GatewayError) -> None:
        call = self.call
        call.trace.metadata["error"] = exc.message
        self.server._finish_trace(call.trace, None, "error", call.t0)
        self.server._call_ended()
        call.request.respond(error_response(exc.status, exc.message, param=exc.param, code=exc.code))

    def cancel(self) -> None:
        """The agent went away: drop the upstream call and record the trace as aborted."""
        conn, self.conn = self.conn, None
        if conn is None:
            return
        conn.cancel()
        assert self.worker is not None
        self.worker.inflight -= 1
        self.server._finish_trace(self.call.trace, None, "abort", self.call.t0)
        self.server._call_ended()


__all__ = ["ParsedCall", "ProxyCall", "ProxyExchange", "start_exchange"]
