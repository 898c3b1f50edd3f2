"""Streamed calls: the upstream's SSE events relayed to the agent as they come, captured into
one trace at ``[DONE]``.

A failure before the head went out is an ordinary error answer; after it (the agent already has
a 200), the agent learns of it from an error event followed by ``[DONE]``, and the trace says
what happened. An agent that goes away cancels the upstream request and leaves an ``abort``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import aiohttp
import msgspec

from rllm.gateway.calls import ProxyCall
from rllm.gateway.capture import Captured, StreamCapture, UpstreamShapeError, check_captured, strip_injected
from rllm.gateway.chat_replies import chat_chunk, confirm_images
from rllm.gateway.errors import GatewayError, error_body
from rllm.gateway.sse import StreamFault, decode_chunk, upstream_chunks
from rllm.runtime.http_messages import Response, StreamResponse

if TYPE_CHECKING:
    from rllm.gateway.cumulative import TokenBridge
    from rllm.gateway.ports import ProxyPort

_json_encode = msgspec.json.Encoder().encode
_JSON = "application/json"
_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


async def forward_stream(proxy: ProxyPort, call: ProxyCall) -> Response | StreamResponse:
    """Send a streaming call with failover and relay its events; the trace is finished either way."""
    ledger = proxy.ledger
    sc = StreamCapture(chat=call.chat and call.bridge is None)
    out: StreamResponse | None = None
    try:
        w, resp = await proxy.sender.post(call.session, call.path, call.body)
    except GatewayError as exc:
        ledger.fail(call.trace, call.t0, exc.message)
        raise
    except asyncio.CancelledError:
        ledger.finish_trace(call.trace, None, "abort", call.t0)
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
        out = StreamResponse(headers=dict(_SSE_HEADERS))
        # A cumulative call with images is held until the upstream's last chunk confirms that
        # the model saw them, so an upstream that ignored them is a 502, never a streamed reply.
        held: list[bytes] | None = [] if call.bridge is not None and call.bridge.images else None
        if held is None:
            await out.prepare(call.request)
        fault = None
        try:
            await _relay_events(proxy, call, resp, out if held is None else held.append, sc)
            sc.checked_result()
            if call.bridge is not None:
                confirm_images(call.bridge, call.bridge.images_used)
        except UpstreamShapeError as exc:
            fault = f"upstream stream has the wrong shape: {exc}"
        except StreamFault as exc:
            fault = str(exc)
        if held is not None:
            if fault is not None:
                status = "error"
                call.trace.metadata["error"] = fault
                raise GatewayError(502, fault, code="upstream_error")
            await out.prepare(call.request)
            await out.write(b"".join(held))
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
            why = f"upstream stalled mid-stream (no data for {proxy.config.upstream_timeout_s}s)"
        else:
            why = f"upstream failed mid-stream: {type(exc).__name__}: {exc}"
        call.trace.metadata["error"] = why
        if out is None or not out.prepared:
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
            assert proxy.bridge is not None and cap is not None  # a plan only where a bridge made it
            proxy.bridge.commit(call.session, call.bridge, cap, call.trace)
        if cap is not None and status == "error" and not cap.completion_ids:
            cap = None
        ledger.finish_trace(call.trace, cap, status, call.t0)


async def _relay_events(
    proxy: ProxyPort,
    call: ProxyCall,
    resp: aiohttp.ClientResponse,
    out: StreamResponse | Callable[[bytes], None],
    sc: StreamCapture,
) -> None:
    """Forward the upstream's SSE events up to ``[DONE]`` to the client (or to ``out``, a
    callable holding them), feeding the capture. Raises StreamFault (or UpstreamShapeError) for
    what the capture cannot take: an event that is not JSON or is larger than
    ``max_stream_event_bytes``, a stream that ends before ``[DONE]``."""
    payloads = upstream_chunks(resp.content.iter_any(), proxy.config.max_stream_event_bytes)
    async with contextlib.aclosing(payloads):
        async for payload in payloads:
            event = client_event(proxy.bridge, call, sc, decode_chunk(payload), payload)
            if isinstance(out, StreamResponse):
                await out.write(event)
            else:
                out(event)


def client_event(
    bridge: TokenBridge | None,
    call: ProxyCall,
    sc: StreamCapture,
    chunk: dict[str, Any],
    payload: bytes | None = None,
) -> bytes:
    """Feed the capture with one upstream chunk and return the SSE event the client gets for
    it: chat-shaped for a cumulative call (``bridge``: the gateway's), else with what the gateway
    injected stripped. ``payload``: the chunk's bytes as they came, sent as they are when nothing
    changed."""
    if call.bridge is not None:
        assert bridge is not None  # a plan only where a bridge made it
        StreamCapture.feed(sc, chunk)
        payload = _json_encode(chat_chunk(bridge.tokenizer, chunk, call.bridge))
    else:
        sc.feed(chunk)
        if strip_injected(chunk, call.wants) or payload is None:
            payload = _json_encode(chunk)
    return b"data: " + payload + b"\n\n"


__all__ = ["StreamFault", "client_event", "forward_stream"]
