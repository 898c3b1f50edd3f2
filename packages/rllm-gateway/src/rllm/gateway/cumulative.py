"""Token truth for multi-turn chats (``tokenizer_mode="cumulative"``).

A chat server re-renders and re-tokenizes the whole history every turn. Detokenize→retokenize
is not the identity (a sampler may emit a non-canonical tokenization; normalizers change
text), so turn k+1's prompt tokens may not start with the tokens turn k actually produced:
training on them would credit tokens the model never sampled.

In cumulative mode the gateway renders the chat template itself and sends token ids to
``/v1/completions``. When a request's messages extend the previous turn of the same
(session, role) — same earlier messages, the previous reply unchanged, new messages after
it — only the new part of the rendered text is tokenized and appended to the previous
prompt + completion tokens. Otherwise (thinking stripped, history compacted, template does
not extend) a new segment starts from a fresh rendering, and the trace says why.

Tool calls: ``tools`` are rendered through the chat template and the completion is parsed back
into OpenAI ``tool_calls`` (:mod:`rllm.gateway.toolcalls`); an assistant message that echoes
the returned content and tool calls extends the token history like a text reply, and the tool
results after it are the new part. A streamed reply comes back as text deltas only (tool calls
are not parsed out of a stream).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from rllm.gateway.capture import Captured
from rllm.gateway.errors import GatewayError
from rllm.gateway.toolcalls import (
    HARMONY,
    HERMES,
    LLAMA3_JSON,
    SCHEMA,
    HarmonyParser,
    ParsedReply,
    detect_format,
    parse_hermes,
    parse_llama3_json,
    parse_with_schema,
    require_format,
    same_tool_calls,
    to_template_messages,
)
from rllm.types import ImageBlock, Message, TraceRecord

# Chat-only request fields that /v1/completions does not take.
_CHAT_ONLY = frozenset(
    {
        "messages",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "response_format",
        "logprobs",
        "top_logprobs",
        "return_token_ids",
        "stream_options",
        "functions",
        "function_call",
        "max_completion_tokens",
        "chat_template_kwargs",
        "add_generation_prompt",
    }
)


@dataclass(slots=True)
class BridgeState:
    """What turn k left behind for turn k+1 of one (session, role)."""

    messages: list[Message]
    response_text: str  # the content returned to the agent (tool-call markup parsed out)
    response_tool_calls: list[dict[str, Any]]
    prompt_text: str
    prompt_ids: list[int]
    completion_ids: list[int]
    tools: Any
    segment: int


@dataclass(slots=True)
class BridgePlan:
    role: str
    messages: list[Message]
    prompt_text: str
    prompt_ids: list[int]
    tools: Any
    segment: int
    wants_token_ids: bool
    wants_logprobs: bool
    stream: bool = False


class TokenBridge:
    def __init__(self, tokenizer: Any) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("cumulative mode needs a tokenizer with a chat_template")
        self.tokenizer = tokenizer
        self.tool_format = detect_format(tokenizer)
        self._harmony: HarmonyParser | None = None

    @classmethod
    def load(cls, path: str) -> TokenBridge:
        """Load a tokenizer (local directory or hub name) with transformers."""
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(path))

    def render(self, messages: list[dict[str, Any]], tools: Any) -> str:
        return self.tokenizer.apply_chat_template(
            to_template_messages(messages), tools=tools, add_generation_prompt=True, tokenize=False
        )

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def prepare(
        self, session: Any, role: str, body: dict[str, Any], messages: list[Message], trace: TraceRecord
    ) -> BridgePlan:
        """Turn a chat request into a completions request with bridged prompt token ids (in place)."""
        tools = body.get("tools")
        if tools:
            require_format(self.tool_format)
        _refuse_images(messages)
        text = self.render(body["messages"], tools)
        prev: BridgeState | None = session.bridges.get(role)
        ids: list[int] | None = None
        reason = None
        if prev is not None:
            reason = self._why_not_extending(prev, messages, tools)
            if reason is None:
                done_text = prev.prompt_text + self.tokenizer.decode(
                    prev.completion_ids, skip_special_tokens=False
                )
                if text.startswith(done_text):
                    ids = prev.prompt_ids + prev.completion_ids + self.encode(text[len(done_text) :])
                else:
                    reason = "the chat template's rendering does not extend the previous turn's tokens"
        if ids is None:
            ids = self.encode(text)
            segment = 0 if prev is None else prev.segment + 1
            if reason is not None:
                trace.metadata["segment_reason"] = reason
        else:
            segment = prev.segment  # type: ignore[union-attr]
        trace.segment = segment
        wants_ids = bool(body.get("return_token_ids"))
        wants_lp = bool(body.get("logprobs"))
        stream = bool(body.get("stream"))
        out = {k: v for k, v in body.items() if k not in _CHAT_ONLY}
        if "max_completion_tokens" in body and "max_tokens" not in body:
            out["max_tokens"] = body["max_completion_tokens"]
        out["prompt"] = ids
        out["stream"] = stream
        body.clear()
        body.update(out)
        return BridgePlan(role, messages, text, ids, tools, segment, wants_ids, wants_lp, stream)

    @staticmethod
    def _why_not_extending(prev: BridgeState, messages: list[Message], tools: Any) -> str | None:
        n = len(prev.messages)
        if tools != prev.tools:
            return "tools changed"
        if len(messages) <= n + 1:
            return "history is not longer than the previous turn"
        if messages[:n] != prev.messages:
            return "earlier messages changed (compaction or edit)"
        reply = messages[n]
        if reply.role != "assistant" or reply.text != prev.response_text:
            return "the previous reply was changed (e.g. thinking stripped)"
        if not same_tool_calls(reply.tool_calls, prev.response_tool_calls):
            return "the previous reply's tool calls were changed"
        return None

    def commit(self, session: Any, plan: BridgePlan, cap: Captured, trace: TraceRecord) -> None:
        """Remember this turn's exact tokens for the next one."""
        if cap.prompt_ids is not None and list(cap.prompt_ids) != plan.prompt_ids:
            trace.metadata["capture_warning"] = "upstream reported prompt ids that differ from those sent"
        trace.prompt_ids = None  # fill_trace sets it from cap; make sure it is what we sent
        cap.prompt_ids = plan.prompt_ids
        if plan.tools and not plan.stream:
            parsed = self.parse_tools(cap)
            cap.text, cap.tool_calls = parsed.content, parsed.tool_calls
            if parsed.tool_calls:
                cap.finish_reason = "tool_calls" if cap.finish_reason == "stop" else cap.finish_reason
            if parsed.error:
                trace.metadata["tool_call_error"] = parsed.error
        if not cap.completion_ids:
            session.bridges.pop(plan.role, None)
            return
        session.bridges[plan.role] = BridgeState(
            messages=plan.messages,
            response_text=cap.text,
            response_tool_calls=list(cap.tool_calls),
            prompt_text=plan.prompt_text,
            prompt_ids=plan.prompt_ids,
            completion_ids=list(cap.completion_ids),
            tools=plan.tools,
            segment=plan.segment,
        )

    def parse_tools(self, cap: Captured) -> ParsedReply:
        """Split the completion into content and OpenAI tool_calls in this model's format."""
        fmt = self.tool_format
        if fmt == HERMES:
            return parse_hermes(self.tokenizer, cap.text)
        if fmt == LLAMA3_JSON:
            return parse_llama3_json(cap.text)
        if fmt == HARMONY:
            if self._harmony is None:
                self._harmony = HarmonyParser()
            return self._harmony.parse(list(cap.completion_ids or ()), cap.text)
        if fmt == SCHEMA:
            return parse_with_schema(self.tokenizer, cap.text)
        return ParsedReply(cap.text)

    # ------------------------------------------------------------------ response shapes
    def to_chat(self, data: dict[str, Any], cap: Captured, plan: BridgePlan) -> dict[str, Any]:
        """A completions response re-shaped as the chat.completion the client asked for."""
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": cap.text or None if cap.tool_calls else cap.text},
            "logprobs": None,
            "finish_reason": cap.finish_reason,
        }
        if cap.tool_calls:
            choice["message"]["tool_calls"] = cap.tool_calls
        if plan.wants_logprobs and cap.completion_ids and cap.logprobs:
            choice["logprobs"] = {
                "content": [
                    self._lp_entry(t, lp) for t, lp in zip(cap.completion_ids, cap.logprobs, strict=False)
                ]
            }
        out = {
            "id": "chatcmpl-" + str(data.get("id", uuid.uuid4().hex)).removeprefix("cmpl-"),
            "object": "chat.completion",
            "created": data.get("created", int(time.time())),
            "model": data.get("model", ""),
            "choices": [choice],
            "usage": data.get("usage"),
        }
        if plan.wants_token_ids:
            out["prompt_token_ids"] = plan.prompt_ids
            choice["token_ids"] = cap.completion_ids
        return out

    def chunk_to_chat(self, chunk: dict[str, Any], plan: BridgePlan) -> dict[str, Any]:
        choices = []
        for c in chunk.get("choices") or ():
            delta: dict[str, Any] = {}
            if c.get("text"):
                delta["content"] = c["text"]
            out_c: dict[str, Any] = {
                "index": c.get("index", 0),
                "delta": delta,
                "logprobs": None,
                "finish_reason": c.get("finish_reason"),
            }
            lp = c.get("logprobs")
            if plan.wants_logprobs and isinstance(lp, dict) and c.get("token_ids"):
                out_c["logprobs"] = {
                    "content": [
                        self._lp_entry(t, x)
                        for t, x in zip(c["token_ids"], lp.get("token_logprobs") or [], strict=False)
                    ]
                }
            choices.append(out_c)
        out = {
            "id": "chatcmpl-" + str(chunk.get("id", "")).removeprefix("cmpl-"),
            "object": "chat.completion.chunk",
            "created": chunk.get("created", int(time.time())),
            "model": chunk.get("model", ""),
            "choices": choices,
        }
        if chunk.get("usage"):
            out["usage"] = chunk["usage"]
        return out

    def _lp_entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        tok = self.tokenizer.decode([token_id])
        return {"token": tok, "logprob": logprob, "bytes": list(tok.encode()), "top_logprobs": []}


def _refuse_images(messages: list[Message]) -> None:
    """Cumulative mode renders with the tokenizer alone, which cannot place an image's tokens;
    sending token ids would silently drop the picture, so an image block is a 400 instead."""
    for i, msg in enumerate(messages):
        if isinstance(msg.content, list):
            for j, block in enumerate(msg.content):
                if isinstance(block, ImageBlock):
                    raise GatewayError(
                        400,
                        "cumulative mode renders text only: image blocks need tokenizer_mode='plain'",
                        param=f"messages[{i}].content[{j}]",
                        code="unsupported_content",
                    )
