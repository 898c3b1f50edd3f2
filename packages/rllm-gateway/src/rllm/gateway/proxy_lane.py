"""The gateway's early lane: a non-streaming proxy call answered without a task.

Under load every hop through the event loop's ready queue waits behind everything else that
became ready in the same pass, and a proxied call through a task costs two such hops more than
the agent's own HTTP client does: the handler task's first step after the request arrives, and
its wake-up after the upstream's answer. Here the request is decoded, traced and written to an
idle kept-alive upstream connection from the I/O callback that completed it, and the answer is
captured and written back to the agent from the I/O callback that completed the upstream's
response. Whatever does not fit (no idle connection, a dropped connection, an upstream that
lives in this process) goes on in a task through the gateway's ordinary failover path, with the
same trace.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import msgspec

from rllm.gateway.calls import ParsedCall, ProxyCall
from rllm.gateway.errors import GatewayError, answer_or_error, gateway_error_response, internal_error_response
from rllm.gateway.upstreams import NoHealthyUpstream, Upstream
from rllm.runtime.http_client import Connection, Outcome, UpstreamBadResponse
from rllm.runtime.http_messages import Request, Response, StreamResponse
from rllm.runtime.inprocess_upstreams import upstream_in_process

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from rllm.gateway.ports import ProxyPort

log = logging.getLogger("rllm.gateway")
_json_encode = msgspec.json.Encoder().encode


def start_exchange(
    proxy: ProxyPort, request: Request, chat: bool, t0: float, parsed: ParsedCall
) -> ProxyExchange | Awaitable[Response | StreamResponse]:
    """Open the call's trace and send it upstream now if a kept-alive connection is idle
    (returns the pending exchange), else return the task path's awaitable for it."""
    ledger = proxy.ledger
    trace = ledger.open_trace(parsed, chat)
    try:
        call = proxy.upstream_call(request, parsed, trace, chat, t0)
    except BaseException:
        ledger.call_ended()
        raise
    exchange = ProxyExchange(proxy, call)
    sender = proxy.sender
    try:
        w = sender.route(parsed.session, parsed.body)
    except NoHealthyUpstream:
        return exchange.in_task()  # the failover path answers 503 and records the error
    if upstream_in_process(w.url) is not None:
        return exchange.in_task()  # the task path hands it to the upstream in this process
    assert sender.fast is not None
    conn = sender.fast.send_nowait(w.url + call.path, _json_encode(call.body), exchange.on_answer)
    if conn is None:
        return exchange.in_task()
    exchange.sent(w, conn)
    return exchange


class ProxyExchange:
    """One call in flight on the early lane; the connection's ``cancel()`` target while it is."""

    __slots__ = ("call", "conn", "proxy", "upstream")

    def __init__(self, proxy: ProxyPort, call: ProxyCall) -> None:
        self.proxy = proxy
        self.call = call
        self.upstream: Upstream | None = None
        self.conn: Connection | None = None

    def sent(self, upstream: Upstream, conn: Connection) -> None:
        self.upstream, self.conn = upstream, conn
        upstream.inflight += 1
        upstream.requests += 1

    def in_task(self) -> Awaitable[Response | StreamResponse]:
        """The rest of the call through the proxy's failover path, as a task would run it."""
        proxy = self.proxy

        async def forward() -> Response:
            try:
                return await proxy.forward(self.call)
            finally:
                proxy.ledger.call_ended()

        return answer_or_error(self.call.request, forward())

    def on_answer(self, outcome: Outcome) -> None:
        """The upstream connection's callback: answer the agent now (or retry in a task)."""
        proxy, w, call = self.proxy, self.upstream, self.call
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
            # failover path retries it, on the same upstream first.
            proxy.ledger.metrics.retries.inc()
            call.request.respond_later(self.in_task())
            return
        status, raw = outcome
        if not w.healthy:
            proxy.sender.pool.mark_answered(w)
        try:
            resp = proxy.answer_whole(call, status, raw)
        except GatewayError as exc:  # answer_whole finished the trace
            resp = gateway_error_response(exc)
        except Exception as exc:  # a bug: answer anyway, as the task path's last line of defence
            log.exception("internal error on %s", call.request.path)
            proxy.ledger.fail_unfinished(call.trace, call.t0, exc)
            resp = internal_error_response(exc)
        proxy.ledger.call_ended()
        call.request.respond(resp)

    def _fail(self, exc: GatewayError) -> None:
        call, ledger = self.call, self.proxy.ledger
        ledger.fail(call.trace, call.t0, exc.message)
        ledger.call_ended()
        call.request.respond(gateway_error_response(exc))

    def cancel(self) -> None:
        """The agent went away: drop the upstream call and record the trace as aborted."""
        conn, self.conn = self.conn, None
        if conn is None:
            return
        conn.cancel()
        assert self.upstream is not None
        self.upstream.inflight -= 1
        ledger = self.proxy.ledger
        ledger.finish_trace(self.call.trace, None, "abort", self.call.t0)
        ledger.call_ended()


__all__ = ["ProxyExchange", "start_exchange"]
