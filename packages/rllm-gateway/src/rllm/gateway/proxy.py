"""The proxy: a validated call turned into the upstream's request, sent, and its answer captured.

``Proxy`` is what both ways of proxying a call share: the task path here (``run``: wait at the
door, open the trace, forward with failover, answer) and the early lane (``proxy_lane``: the same
call answered from I/O callbacks) use the same public members (``ledger`` to open and finish
traces, ``upstream_call``, ``sender`` to route and send, ``answer_whole``, ``forward``), so neither
reaches into the other. Streams go through ``streaming``, partial rollouts through ``partial``
and ``partial_stream``, hosted providers through ``hosted``; those helpers know the proxy only as
``rllm.gateway.ports.ProxyPort``. Sending, with failover across the upstreams, is
``rllm.gateway.sending``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from rllm.gateway.calls import CallLedger, ParsedCall, ProxyCall
from rllm.gateway.capture import UpstreamShapeError, inject_capture, read_answer, strip_injected
from rllm.gateway.chat_replies import chat_completion
from rllm.gateway.config import GatewayConfig
from rllm.gateway.errors import GatewayError
from rllm.gateway.hosted import HostedProvider, hosted_call
from rllm.gateway.jsonguard import JsonLimitError, check_json
from rllm.gateway.partial import check_partial_call, forward_partial
from rllm.gateway.partial_stream import forward_partial_stream
from rllm.gateway.sending import UpstreamSender
from rllm.gateway.streaming import forward_stream
from rllm.gateway.upstreams import UpstreamPool
from rllm.runtime.http_messages import Request, Response, StreamResponse
from rllm.types import TraceRecord

if TYPE_CHECKING:
    from rllm.gateway.cumulative import TokenBridge

_json_decode = msgspec.json.Decoder().decode
_json_encode = msgspec.json.Encoder().encode
_JSON = "application/json"


class Proxy:
    """The proxying machinery of one gateway (see the module docstring). ``open()`` once the
    event loop runs, ``close()`` at the end."""

    def __init__(self, config: GatewayConfig, pool: UpstreamPool, ledger: CallLedger) -> None:
        self.config = config
        self.pool = pool
        self.ledger = ledger
        self.sender = UpstreamSender(config, pool, ledger)
        self.bridge: TokenBridge | None = None  # cumulative mode's
        self.hosted: HostedProvider | None = None

    async def open(self) -> None:
        """Create the upstream clients (and load the token bridge or the hosted provider)."""
        cfg = self.config
        await self.sender.open()
        if cfg.tokenizer_mode == "cumulative":
            from rllm.gateway.cumulative import TokenBridge

            self.bridge = TokenBridge.load(cfg.tokenizer_path)  # type: ignore[arg-type]
        if cfg.hosted_model:
            self.hosted = HostedProvider(
                cfg.hosted_model, api_key=cfg.hosted_api_key, api_base=cfg.hosted_api_base
            )

    async def close(self) -> None:
        await self.sender.close()

    # ------------------------------------------------------------------ the task path
    async def run(
        self, request: Request, chat: bool, t0: float, parsed: ParsedCall
    ) -> Response | StreamResponse:
        """A call in a task: wait while paused, open its trace, forward it (stream, hosted or
        whole) and answer."""
        ledger = self.ledger
        if self.config.partial_rollouts:
            check_partial_call(parsed, ledger.default_sampling, continues=not chat or self.bridge is not None)
        if not ledger.admitting:
            await ledger.wait_admitted(parsed)
        trace = ledger.open_trace(parsed, chat)
        try:
            stream = bool(parsed.body.get("stream"))
            if self.hosted is not None:
                return await hosted_call(self.hosted, ledger, request, parsed.body, trace, chat, stream, t0)
            call = self.upstream_call(request, parsed, trace, chat, t0)
            if self.config.partial_rollouts:
                if stream:
                    return await forward_partial_stream(self, call)
                return await forward_partial(self, call, parsed)
            return await (forward_stream(self, call) if stream else self.forward(call))
        finally:
            ledger.call_ended()

    def upstream_call(
        self, request: Request, parsed: ParsedCall, trace: TraceRecord, chat: bool, t0: float
    ) -> ProxyCall:
        """Turn the agent's body into what the upstream gets (token bridge, capture fields)."""
        session, role, body, messages = parsed.session, parsed.role, parsed.body, parsed.messages
        bridge = None
        if chat and self.bridge is not None:
            bridge = self.bridge.prepare(session, role, body, messages, trace)
        wants = inject_capture(body, chat=chat and bridge is None, stream=bool(body.get("stream")))
        path = "/chat/completions" if chat and bridge is None else "/completions"
        return ProxyCall(request, session, path, body, wants, trace, t0, chat, bridge)

    async def forward(self, call: ProxyCall) -> Response:
        """Send a non-streaming call with failover and answer it; the trace is finished either way."""
        status, raw = await self.sender.send_whole(call)
        return self.answer_whole(call, status, raw)

    def answer_whole(self, call: ProxyCall, status: int, raw: bytes) -> Response:
        """The agent's answer from the upstream's whole one; finishes the trace."""
        ledger = self.ledger
        ledger.refuse_if_session_ended(call, "was in flight; its answer was discarded")
        if status != 200:
            call.trace.metadata["error"] = raw[:2000].decode(errors="replace")
            call.trace.metadata["upstream_status"] = status
            ledger.finish_trace(call.trace, None, "error", call.t0)
            return Response(status=status, body=raw, content_type=_JSON)
        try:
            data = _json_decode(raw)
            cap = read_answer(data, chat=call.chat and call.bridge is None)  # checks what is kept
            if self.config.store_raw:  # then the whole answer is kept: it must fit the limits too
                check_json(data, self.config.max_json_depth)
                call.trace.raw_response = dict(data)
            if call.bridge is not None:
                assert self.bridge is not None  # a call has a plan only where there is a bridge
                self.bridge.commit(call.session, call.bridge, cap, call.trace)
                data = chat_completion(self.bridge.tokenizer, data, cap, call.bridge)
                out = _json_encode(data)
            else:
                out = _json_encode(data) if strip_injected(data, call.wants) else raw
        except (msgspec.DecodeError, RecursionError, JsonLimitError, UpstreamShapeError) as exc:
            why = upstream_fault(exc)
            ledger.fail(call.trace, call.t0, why)
            raise GatewayError(502, why, code="upstream_error") from None
        ledger.finish_trace(call.trace, cap, "ok", call.t0)
        return Response(body=out, content_type=_JSON)

    async def list_models(self) -> Response:
        """``GET /v1/models``: the hosted model, or what an upstream serves."""
        if self.hosted is not None:
            data = [{"id": self.config.hosted_model, "object": "model", "owned_by": "hosted"}]
            return Response(body=_json_encode({"object": "list", "data": data}), content_type=_JSON)
        return await self.sender.list_models()


def upstream_fault(exc: BaseException) -> str:
    """One line saying what was wrong with an upstream's answer."""
    if isinstance(exc, msgspec.DecodeError):
        return f"upstream sent malformed JSON: {exc}"
    if isinstance(exc, RecursionError):
        return "upstream answer nested too deep"
    if isinstance(exc, JsonLimitError):
        return f"upstream answer: {exc.message} at {exc.path}"
    return f"upstream answer has the wrong shape: {exc}"


__all__ = ["Proxy", "upstream_fault"]
