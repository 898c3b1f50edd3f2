"""Partial rollouts of streamed calls: one client stream across the weight syncs that abort it.

The upstream's events are relayed as they come, read by the same loop as an ordinary stream's
(``rllm.gateway.sse.upstream_chunks``; ``rllm.gateway.streaming`` relays those). When the upstream ends the call with ``finish_reason = "abort"`` (a pause
aborted it, see ``rllm.gateway.partial``), the client has already been sent the tokens so far;
the abort itself, and what follows it upstream (a usage chunk, ``[DONE]``), is not relayed. The
call parks until the gateway resumes, is re-sent as a ``/completions`` continuation (the prompt
ids plus every id generated so far, ``max_tokens`` reduced by their number), and the
continuation's events go out on the SAME client stream: its chunks carry the first send's ``id``
and ``created``, no prompt ids of their own (the continuation's prompt is the first prompt plus
the ids already streamed), completions ``text_offset`` shifted by the text already sent, and a
final usage that counts the first prompt and every completion token. The client thus reads one
uninterrupted, token-true stream with the real ``finish_reason``; the trace records
``metadata["version_spans"]`` and the oldest version exactly as for a whole answer.

Only calls sent to ``/completions`` can be continued this way (completions calls, and chat calls
in cumulative mode, where the gateway renders the prompt); a chat stream the upstream renders
itself is refused before it starts (``check_partial_call``): its text reaches the client as it
is sampled, so it could be neither restarted whole nor continued with the upstream's reply
parsing.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from typing import TYPE_CHECKING, Any

import aiohttp

from rllm.gateway.capture import Captured, StreamCapture, UpstreamShapeError, check_captured
from rllm.gateway.chat_replies import confirm_images
from rllm.gateway.errors import GatewayError, error_body
from rllm.gateway.sse import StreamFault, decode_chunk, upstream_chunks
from rllm.gateway.streaming import client_event
from rllm.runtime.http_messages import Response, StreamResponse

if TYPE_CHECKING:
    from rllm.gateway.calls import ProxyCall
    from rllm.gateway.ports import ProxyPort

_JSON = "application/json"
_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
VERSION_SPANS = "version_spans"


class _Stream:
    """The state of one client stream across the sends of its call."""

    def __init__(self, proxy: ProxyPort, call: ProxyCall) -> None:
        self.proxy, self.call = proxy, call
        self.sc = StreamCapture(chat=False)  # only /completions calls are continued
        self.out: StreamResponse | None = None
        # A cumulative call with images is held until its last chunk confirms the model saw
        # them (as in ``streaming``): then nothing goes out before the call is answered.
        self.held: list[bytes] | None = [] if call.bridge is not None and call.bridge.images else None
        self.sends = 0  # sends so far; > 1: the events are a continuation's
        self.text_sent = 0  # characters of completion text relayed (completions text_offset)
        self.head: dict[str, Any] = {}  # the first send's id and created, stamped on every chunk
        self.prompt_len = 0  # the first send's prompt, for the final usage

    @property
    def prepared(self) -> bool:
        return self.out is not None and self.out.prepared

    async def emit(self, event: bytes) -> None:
        if self.held is not None:
            self.held.append(event)
            return
        if self.out is None:
            self.out = StreamResponse(headers=dict(_SSE_HEADERS))
        if not self.out.prepared:
            await self.out.prepare(self.call.request)
        await self.out.write(event)

    async def relay(self, resp: aiohttp.ClientResponse) -> str:
        """Relay one send's events; ``"abort"`` when the upstream aborted it, ``"done"`` at its
        ``[DONE]``. Raises StreamFault (or UpstreamShapeError) for what cannot be relayed."""
        aborted = False
        self.sends += 1
        payloads = upstream_chunks(resp.content.iter_any(), self.proxy.config.max_stream_event_bytes)
        async with contextlib.aclosing(payloads):
            async for payload in payloads:
                if aborted:
                    continue  # the aborted send's usage chunk: the client's usage comes at the end
                chunk = decode_chunk(payload)
                aborted = self._rewrite(chunk)
                if chunk.get("choices") == [] and not chunk.get("usage") and aborted:
                    continue  # nothing left of the abort chunk to relay
                await self._send(chunk)
        return "abort" if aborted else "done"

    def _rewrite(self, chunk: dict[str, Any]) -> bool:
        """Make a send's chunk part of the one client stream (see the module docstring); True
        when it is the chunk that says the send was aborted."""
        if self.sends == 1:
            if not self.head:
                self.head = {k: chunk[k] for k in ("id", "created") if k in chunk}
        else:
            chunk.update(self.head)
            chunk.pop("prompt_token_ids", None)
        aborted = False
        kept = []
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                kept.append(choice)
                continue
            if self.sends > 1:
                choice.pop("prompt_token_ids", None)
                _shift_offsets(choice.get("logprobs"), self.text_sent)
            if choice.get("finish_reason") == "abort":
                aborted = True
                choice["finish_reason"] = None
                if not choice.get("text") and not choice.get("token_ids"):
                    continue
            text = choice.get("text")
            if self.sends > 1 and isinstance(text, str):
                choice["text"] = text = self._text_delta(choice.get("token_ids"), text)
            if isinstance(text, str):
                self.text_sent += len(text)
            kept.append(choice)
        if "choices" in chunk:
            chunk["choices"] = kept
        usage = chunk.get("usage")
        if isinstance(usage, dict) and not aborted and self.sends > 1:
            ids = len(self.sc.cap.completion_ids or ()) + _ids_in(chunk)
            usage.update(
                prompt_tokens=self.prompt_len, completion_tokens=ids, total_tokens=self.prompt_len + ids
            )
        elif aborted:
            chunk.pop("usage", None)
        return aborted

    def _text_delta(self, ids: Any, text: str) -> str:
        """A continuation's text as the uninterrupted stream would have had it: with the
        gateway's tokenizer, what these ids add to the decoding of every id streamed before
        them (the upstream decoded them alone, which may drop the space a word starts with or
        split a character); the upstream's text otherwise, or when it is not the ids' plain
        decoding (a stop string cut it)."""
        bridge = self.proxy.bridge
        if bridge is None or not isinstance(ids, list) or not ids:
            return text
        decode = bridge.tokenizer.decode
        if decode(ids, skip_special_tokens=True) != text:
            return text
        before = list(self.sc.cap.completion_ids or ())
        head = decode(before, skip_special_tokens=True)
        whole = decode(before + ids, skip_special_tokens=True)
        return whole[len(head) :] if whole.startswith(head) else text

    async def _send(self, chunk: dict[str, Any]) -> None:
        event = client_event(self.proxy.bridge, self.call, self.sc, chunk)  # rewritten: encoded anew
        if self.sends == 1 and self.prompt_len == 0 and self.sc.cap.prompt_ids is not None:
            self.prompt_len = len(self.sc.cap.prompt_ids)
        await self.emit(event)


def _ids_in(chunk: dict[str, Any]) -> int:
    n = 0
    for choice in chunk.get("choices") or ():
        ids = choice.get("token_ids") if isinstance(choice, dict) and choice.get("index", 0) == 0 else None
        n += len(ids) if isinstance(ids, list) else 0
    return n


def _shift_offsets(logprobs: Any, shift: int) -> None:
    offsets = logprobs.get("text_offset") if isinstance(logprobs, dict) else None
    if shift and isinstance(offsets, list):
        logprobs["text_offset"] = [o + shift if isinstance(o, int) else o for o in offsets]


def _continuation(first: dict[str, Any], cap: Captured) -> dict[str, Any]:
    """The first body, its prompt extended by every id streamed so far, its budget reduced."""
    body = copy.copy(first)
    generated = list(cap.completion_ids or ())
    body["prompt"] = [*(cap.prompt_ids or ()), *generated]
    budget = first.get("max_tokens", first.get("max_completion_tokens"))
    body.pop("max_completion_tokens", None)
    if not isinstance(budget, int):  # check_partial_call refused calls without it
        raise GatewayError(400, "partial rollouts need max_tokens on every call", param="max_tokens")
    # An aborted row stopped before its budget ran out, so at least one token is left.
    body["max_tokens"] = max(1, budget - len(generated))
    return body


async def forward_partial_stream(proxy: ProxyPort, call: ProxyCall) -> Response | StreamResponse:
    """Send a streaming call; each time the upstream aborts it, park it and continue it on the
    same client stream. The trace is finished (or discarded, 410) either way."""
    ledger = proxy.ledger
    first = call.body
    version = ledger.weight_version if call.trace.weight_version is None else call.trace.weight_version
    s = _Stream(proxy, call)
    spans: list[list[int]] = []
    status, keep_trace = "ok", True
    try:
        while True:
            before, text_before = len(s.sc.cap.completion_ids or ()), len(s.sc.cap.text)
            try:
                w, resp = await proxy.sender.post(call.session, call.path, call.body)
            except GatewayError as exc:
                if s.sends == 0:
                    ledger.fail(call.trace, call.t0, exc.message)
                    keep_trace = False  # fail finished it
                    raise
                raise StreamFault(exc.message) from None
            w.inflight += 1
            try:
                if resp.status != 200:
                    raw = await resp.read()
                    call.trace.metadata["upstream_status"] = resp.status
                    if s.sends == 0:
                        call.trace.metadata["error"] = raw[:2000].decode(errors="replace")
                        status = "error"
                        return Response(status=resp.status, body=raw, content_type=_JSON)
                    raise StreamFault(
                        f"upstream answered {resp.status} to the call's continuation: "
                        + raw[:500].decode(errors="replace")
                    )
                ended = await s.relay(resp)
            finally:
                w.inflight -= 1
                resp.close()
            spans.append([version, len(s.sc.cap.completion_ids or ()) - before])
            if ended == "done":
                break
            sampled_text = len(s.sc.cap.text) > text_before
            if s.sc.cap.prompt_ids is None or (sampled_text and spans[-1][1] == 0):
                raise StreamFault(
                    "the upstream aborted the call without its token ids; it cannot be continued"
                )
            await ledger.park()  # cancelled while parked: the trace ends as an abort (below)
            try:
                ledger.refuse_if_session_ended(call, "waited to be continued; it was discarded")
            except GatewayError as exc:
                keep_trace = False  # discarded: nobody can read it any more
                if not s.prepared:
                    raise
                await _end_with_error(s, exc.status, exc.message)
                return s.out  # type: ignore[return-value]
            version = ledger.weight_version
            call.body = _continuation(first, s.sc.cap)
        s.sc.checked_result()
        if s.held is not None:
            assert call.bridge is not None
            confirm_images(call.bridge, call.bridge.images_used)
            s.held, held = None, s.held
            await s.emit(b"".join(held))
        await s.emit(b"data: [DONE]\n\n")
        s.sc.saw_done = True
        assert s.out is not None
        return s.out
    except (StreamFault, UpstreamShapeError, TimeoutError, aiohttp.ClientPayloadError) as exc:
        status = "error"
        if isinstance(exc, TimeoutError):
            why = f"upstream stalled mid-stream (no data for {proxy.config.upstream_timeout_s}s)"
        elif isinstance(exc, UpstreamShapeError):
            why = f"upstream stream has the wrong shape: {exc}"
        elif isinstance(exc, aiohttp.ClientPayloadError):
            why = f"upstream failed mid-stream: {type(exc).__name__}: {exc}"
        else:
            why = str(exc)
        call.trace.metadata["error"] = why
        if s.held is not None or not s.prepared:
            raise GatewayError(502, why, code="upstream_error") from None
        await _end_with_error(s, 502, why)
        return s.out  # type: ignore[return-value]
    except (asyncio.CancelledError, ConnectionResetError, aiohttp.ClientConnectionResetError):
        status = "abort"  # the client went away: closing ``resp`` cancelled the upstream request
        raise
    except (aiohttp.ClientError, OSError) as exc:
        status = "error"
        why = f"upstream failed mid-stream: {type(exc).__name__}: {exc}"
        call.trace.metadata["error"] = why
        if s.held is not None or not s.prepared:
            raise GatewayError(502, why, code="upstream_error") from None
        await _end_with_error(s, 502, why)
        return s.out  # type: ignore[return-value]
    finally:
        if keep_trace:
            _finish(proxy, call, s.sc, spans, version, status)


async def _end_with_error(s: _Stream, code: int, why: str) -> None:
    """The head went out as 200: the client learns of the failure from an error event."""
    with contextlib.suppress(Exception):
        await s.emit(b"data: " + error_body(code, why) + b"\n\n")
        await s.emit(b"data: [DONE]\n\n")


def _finish(
    proxy: ProxyPort, call: ProxyCall, sc: StreamCapture, spans: list[list[int]], version: int, status: str
) -> None:
    """The call's one trace: what was streamed, and which version sampled which tokens."""
    cap: Captured | None = sc.result()
    try:
        check_captured(cap)  # type: ignore[arg-type]
    except UpstreamShapeError:
        cap = None
    if call.bridge is not None and status == "ok" and cap is not None:
        assert proxy.bridge is not None  # a plan only where a bridge made it
        proxy.bridge.commit(call.session, call.bridge, cap, call.trace)
    if cap is not None and status == "error" and not cap.completion_ids:
        cap = None
    if len(spans) > 1:
        kept = [s for s in spans if s[1]]
        call.trace.metadata[VERSION_SPANS] = kept
        call.trace.weight_version = kept[0][0] if kept else version
    proxy.ledger.finish_trace(call.trace, cap, status, call.t0)


__all__ = ["forward_partial_stream"]
