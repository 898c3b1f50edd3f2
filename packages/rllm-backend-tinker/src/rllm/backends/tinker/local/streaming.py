"""Streamed answers of the local sampler: a whole answer sent as Server-Sent Events.

The sampler generates a batch of rows together, so a stream is written once its answer is
complete: per choice a role chunk (chat), one chunk with all of its text, token ids and
logprobs, and a finish chunk; then a usage chunk when ``stream_options.include_usage`` asks for
one, and ``[DONE]``. Agents that always stream (many CLI harnesses do) thus run on the embedded
backend, and the gateway captures the same ids and logprobs as from a whole answer.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from rllm.backends.tinker.local.protocol import RequestError

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


def include_usage(body: dict[str, Any]) -> bool:
    """Whether a streamed request asks for a final usage chunk; RequestError for a bad field."""
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
        raise RequestError("'stream_options' must be {\"include_usage\": true|false}", "stream_options")
    return bool(options.get("include_usage"))


def stream_chunks(answer: dict[str, Any], *, chat: bool, usage: bool) -> list[dict[str, Any]]:
    """The chunks of ``answer`` (a chat.completion or text_completion body, as builtins)."""
    head = {k: answer[k] for k in ("id", "created", "model")}
    kind = "chat.completion.chunk" if chat else "text_completion"
    extras = {k: answer[k] for k in ("weight_version", "images_used") if k in answer}

    def chunk(choices: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
        return {**head, "object": kind, "choices": choices, **fields}

    chunks: list[dict[str, Any]] = []
    for choice in answer["choices"]:
        index = choice["index"]
        body: dict[str, Any] = {"index": index, "logprobs": choice.get("logprobs"), "finish_reason": None}
        if "token_ids" in choice:
            body["token_ids"] = choice["token_ids"]
        if chat:
            chunks.append(chunk([{"index": index, "delta": {"role": "assistant", "content": ""}}]))
            message = choice["message"]
            body["delta"] = {"content": message["content"]}
            if message.get("tool_calls"):  # whole calls, one delta each, indexed as OpenAI's
                body["delta"]["tool_calls"] = [{"index": k, **c} for k, c in enumerate(message["tool_calls"])]
        else:
            body["text"] = choice["text"]
            if "prompt_token_ids" in choice:
                body["prompt_token_ids"] = choice["prompt_token_ids"]
        chunks.append(chunk([body]))
        finish = {"index": index, "finish_reason": choice["finish_reason"], "logprobs": None}
        chunks.append(chunk([{**finish, "delta": {}} if chat else {**finish, "text": ""}]))
    if "prompt_token_ids" in answer and chunks:
        chunks[0]["prompt_token_ids"] = answer["prompt_token_ids"]
    if chunks:
        chunks[-1].update(extras)
    if usage:
        chunks.append(chunk([], usage=answer["usage"]))
    return chunks


async def send_stream(request: web.Request, chunks: list[dict[str, Any]]) -> web.StreamResponse:
    """Write ``chunks`` as SSE ``data:`` events, then ``data: [DONE]``."""
    resp = web.StreamResponse(headers=SSE_HEADERS)
    await resp.prepare(request)
    payload = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
    await resp.write(payload + b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


__all__ = ["include_usage", "send_stream", "stream_chunks"]
