"""The mock upstream's streamed replies: Server-Sent Events in vLLM's chunk format, one chunk
per token, then the tool calls, the finish reason and (when asked) the usage."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import msgspec

from rllm.runtime.http_messages import Request, StreamResponse
from rllm.testing.mock_replies import Generation, split_text
from rllm.testing.mock_tokens import MockTokens
from rllm.types.openai import (
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatDelta,
    Completion,
    CompletionChoice,
    response_id,
    usage,
)

_json_encode = msgspec.json.Encoder().encode
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


@dataclass
class StreamPlan:
    """How to stream one reply: its request, prompt and generation, and the faults to play."""

    body: dict[str, Any]
    model: str
    prompt_ids: list[int]
    gen: Generation
    chat: bool
    chunk_delay: float = 0.0
    die_mid_stream: bool = False


async def stream_reply(request: Request, tokens: MockTokens, plan: StreamPlan) -> StreamResponse:
    """Send ``plan``'s reply as SSE; with ``die_mid_stream`` the connection closes halfway."""
    resp = StreamResponse(headers=SSE_HEADERS)
    await resp.prepare(request)
    body, gen, chat = plan.body, plan.gen, plan.chat
    rid = response_id("chatcmpl" if chat else "cmpl")
    created = int(time.time())  # one timestamp for every chunk of the reply
    model = body.get("model") or plan.model
    want_ids = bool(body.get("return_token_ids"))
    want_lp = bool(body.get("logprobs"))
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

    async def send(obj: Any) -> None:
        await resp.write(b"data: " + _json_encode(obj) + b"\n\n")

    if chat:
        first = ChatCompletionChunk(
            id=rid,
            created=created,
            model=model,
            choices=[ChatChunkChoice(delta=ChatDelta(role="assistant", content=""))],
        )
        if want_ids:
            first.prompt_token_ids = plan.prompt_ids
        await send(first)
    # One chunk per token; the text of a chunk is the decoded piece.
    pieces = split_text(gen.text, len(gen.ids))
    for i, tid in enumerate(gen.ids):
        if plan.die_mid_stream and i == len(gen.ids) // 2:
            request.abort()
            return resp
        if plan.chunk_delay:
            await asyncio.sleep(plan.chunk_delay)
        ids: Any = [tid] if want_ids else msgspec.UNSET
        if chat:
            chunk: Any = ChatCompletionChunk(
                id=rid,
                created=created,
                model=model,
                choices=[
                    ChatChunkChoice(
                        delta=ChatDelta(content=pieces[i]),
                        logprobs=tokens.chat_logprobs([tid]) if want_lp else None,
                        token_ids=ids,
                    )
                ],
            )
        else:
            choice = CompletionChoice(
                index=0,
                text=pieces[i],
                finish_reason=None,
                logprobs=tokens.completion_logprobs([tid]) if want_lp else None,
                token_ids=ids,
            )
            chunk = Completion(id=rid, created=created, model=model, choices=[choice])
            if want_ids and i == 0:
                chunk.prompt_token_ids = choice.prompt_token_ids = plan.prompt_ids
        await send(chunk)
    if gen.tool_calls and chat:
        deltas = [{"index": j, **tc} for j, tc in enumerate(gen.tool_calls)]
        await send(
            ChatCompletionChunk(
                id=rid,
                created=created,
                model=model,
                choices=[ChatChunkChoice(delta=ChatDelta(tool_calls=deltas))],
            )
        )
    if chat:
        last: Any = ChatCompletionChunk(
            id=rid,
            created=created,
            model=model,
            choices=[ChatChunkChoice(delta=ChatDelta(), finish_reason=gen.finish_reason)],
        )
    else:
        last = Completion(
            id=rid,
            created=created,
            model=model,
            choices=[CompletionChoice(index=0, text="", finish_reason=gen.finish_reason)],
        )
    await send(last)
    if include_usage:
        counts = usage(len(plan.prompt_ids), len(gen.ids))
        if chat:
            await send(ChatCompletionChunk(id=rid, created=created, model=model, choices=[], usage=counts))
        else:
            await send(Completion(id=rid, created=created, model=model, choices=[], usage=counts))
    await resp.write(b"data: [DONE]\n\n")  # the server ends the chunked body on return
    return resp
