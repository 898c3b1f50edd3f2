"""Hosted providers (OpenAI, Anthropic, ...) through LiteLLM, for evaluation with API models.

Hosted APIs return no token ids, so their traces hold messages, text, tool calls and usage.
LiteLLM is an optional extra (``rllm-gateway[hosted]``), imported only when configured.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import TYPE_CHECKING, Any

import msgspec

from rllm.gateway.capture import Captured, capture_response
from rllm.gateway.errors import GatewayError
from rllm.runtime.http_messages import Request, Response, StreamResponse
from rllm.types import TraceRecord

if TYPE_CHECKING:
    from rllm.gateway.calls import CallLedger

_json_encode = msgspec.json.Encoder().encode

# Request fields passed on to litellm.acompletion; anything else the client sent is dropped.
_PASS = (
    "messages",
    "tools",
    "tool_choice",
    "temperature",
    "top_p",
    "max_tokens",
    "max_completion_tokens",
    "stop",
    "seed",
    "response_format",
    "parallel_tool_calls",
    "presence_penalty",
    "frequency_penalty",
    "n",
    "user",
)


class HostedProvider:
    """One hosted model reached through LiteLLM (imported when the provider is made)."""

    def __init__(self, model: str, *, api_key: str | None = None, api_base: str | None = None) -> None:
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network fetch at import
        import litellm

        # LiteLLM prints a "Give Feedback / Get Help" banner to stdout on every failed call; the
        # error itself (its root cause) reaches the client and the trace, so the banner is noise.
        litellm.suppress_debug_info = True
        self._litellm = litellm
        self.model = model
        self.api_key = api_key
        self.api_base = api_base

    async def complete(self, body: dict[str, Any]) -> tuple[dict[str, Any], Captured]:
        kwargs = {k: body[k] for k in _PASS if k in body}
        if self.api_key is not None:
            kwargs["api_key"] = self.api_key
        if self.api_base is not None:
            kwargs["api_base"] = self.api_base
        resp = await self._litellm.acompletion(model=self.model, **kwargs)
        # ``stream`` is never passed on (see _PASS), so LiteLLM answers with a whole ModelResponse.
        assert isinstance(resp, self._litellm.ModelResponse)
        data = resp.model_dump(exclude_none=False)
        data.pop("_hidden_params", None)
        cap = capture_response(data, chat=True)
        # Hosted APIs have no token truth.
        cap.prompt_ids = cap.completion_ids = cap.completion_logprobs = None
        return data, cap


def _first_line(exc: BaseException, limit: int = 500) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else "")[:limit]


def as_sse_chunks(data: dict[str, Any]) -> list[dict[str, Any]]:
    """A whole chat.completion as stream chunks (for clients that asked to stream)."""
    base = {
        "id": data.get("id", ""),
        "object": "chat.completion.chunk",
        "created": data.get("created", int(time.time())),
        "model": data.get("model", ""),
    }
    out = []
    for c in data.get("choices") or ():
        msg = c.get("message") or {}
        delta: dict[str, Any] = {"role": "assistant", "content": msg.get("content")}
        if msg.get("tool_calls"):
            delta["tool_calls"] = [{"index": i, **tc} for i, tc in enumerate(msg["tool_calls"])]
        out.append({**base, "choices": [{"index": c.get("index", 0), "delta": delta, "finish_reason": None}]})
        out.append(
            {
                **base,
                "choices": [
                    {"index": c.get("index", 0), "delta": {}, "finish_reason": c.get("finish_reason")}
                ],
            }
        )
    return out


async def hosted_call(
    provider: HostedProvider,
    ledger: CallLedger,
    request: Request,
    body: dict[str, Any],
    trace: TraceRecord,
    chat: bool,
    stream: bool,
    t0: float,
) -> Response | StreamResponse:
    """Answer a call from the hosted provider and finish its trace; a client that asked to
    stream gets the whole answer as stream chunks."""
    if not chat:
        raise GatewayError(400, "hosted providers are reached through /v1/chat/completions only")
    try:
        data, cap = await provider.complete(body)
    except asyncio.CancelledError:
        ledger.finish_trace(trace, None, "abort", t0)
        raise
    except Exception as exc:
        ledger.fail(trace, t0, f"{type(exc).__name__}: {exc}")
        status = getattr(exc, "status_code", 502)
        raise GatewayError(
            status if isinstance(status, int) and 400 <= status < 600 else 502,
            # The provider's own words carry the root cause ("Missing credentials ... OPENAI_API_KEY").
            f"hosted provider failed: {type(exc).__name__}: {_first_line(exc)}",
            code="upstream_error",
        ) from None
    ledger.finish_trace(trace, cap, "ok", t0)
    if not stream:
        return Response(body=_json_encode(data), content_type="application/json")
    out = StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await out.prepare(request)
    for chunk in as_sse_chunks(data):
        await out.write(b"data: " + _json_encode(chunk) + b"\n\n")
    await out.write(b"data: [DONE]\n\n")
    return out
