"""What the mock upstream answers: scripted replies, the tokens it "samples" for them, and the
whole chat / completion bodies (built with :mod:`rllm.types.openai`)."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from rllm.testing.mock_tokens import MockTokens, text_of
from rllm.types.openai import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    Completion,
    CompletionChoice,
    response_id,
    usage,
)

_json_encode = msgspec.json.Encoder().encode


@dataclass
class MockReply:
    """A scripted assistant turn: text, tool calls (OpenAI dicts or (name, arguments) pairs)."""

    text: str = ""
    tool_calls: list[Any] | None = None
    finish_reason: str | None = None


Responder = Callable[[dict[str, Any]], "str | MockReply | Awaitable[str | MockReply | None] | None"]


@dataclass
class Generation:
    """A reply as sampled: its text, token ids, finish reason and parsed tool calls."""

    text: str
    ids: list[int]
    finish_reason: str
    tool_calls: list[dict[str, Any]]


def as_reply(raw: str | MockReply | None, body: dict[str, Any]) -> MockReply:
    """A responder's answer as a MockReply; ``None`` is the default echo of the last message."""
    if raw is None:
        return MockReply(text=default_text(body))
    return MockReply(text=raw) if isinstance(raw, str) else raw


def generate(tokens: MockTokens, reply: MockReply, body: dict[str, Any]) -> Generation:
    """The tokens a model would sample for ``reply``, cut at the request's ``max_tokens``."""
    text = reply.text
    tool_calls = normalise_tool_calls(reply.tool_calls) if reply.tool_calls else []
    sampled_text = text
    if tool_calls:
        # The model "emits" the calls as text; the server parses them out, as vLLM does.
        sampled_text = text + "".join(
            f"<tool_call>{tc['function']['name']}:{tc['function']['arguments']}</tool_call>"
            for tc in tool_calls
        )
    ids = tokens.encode_text(sampled_text)
    finish = reply.finish_reason or ("tool_calls" if tool_calls else "stop")
    max_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
    if isinstance(max_tokens, int) and max_tokens > 0 and len(ids) > max_tokens:
        ids = ids[:max_tokens]
        finish = "length"
        tool_calls = []
        text = tokens.decode(ids)
    elif tokens.eos_id is not None:
        ids = [*ids, tokens.eos_id]
    return Generation(text=text, ids=ids, finish_reason=finish, tool_calls=tool_calls)


def chat_body(
    tokens: MockTokens, body: dict[str, Any], model: str, prompt_ids: list[int], gen: Generation
) -> ChatCompletion:
    """The whole chat.completion for ``gen``, with logprobs and token ids when the request asks."""
    choice = ChatChoice(
        index=0,
        message=AssistantMessage(content=gen.text or None, refusal=None, tool_calls=gen.tool_calls),
        finish_reason=gen.finish_reason,
        logprobs=tokens.chat_logprobs(gen.ids) if body.get("logprobs") else None,
    )
    out = ChatCompletion(
        id=response_id("chatcmpl"),
        model=body.get("model") or model,
        choices=[choice],
        usage=usage(len(prompt_ids), len(gen.ids)),
    )
    if body.get("return_token_ids"):
        out.prompt_token_ids = prompt_ids
        choice.token_ids = gen.ids
    return out


def completion_body(
    tokens: MockTokens, body: dict[str, Any], model: str, prompt_ids: list[int], gen: Generation
) -> Completion:
    """The whole text_completion for ``gen`` (``logprobs: 0`` asks for logprobs too)."""
    want_lp = body.get("logprobs") is not None and body.get("logprobs") is not False
    choice = CompletionChoice(
        index=0,
        text=gen.text,
        finish_reason=gen.finish_reason if gen.finish_reason != "tool_calls" else "stop",
        logprobs=tokens.completion_logprobs(gen.ids) if want_lp else None,
    )
    out = Completion(
        id=response_id("cmpl"),
        model=body.get("model") or model,
        choices=[choice],
        usage=usage(len(prompt_ids), len(gen.ids)),
    )
    if body.get("return_token_ids"):
        choice.prompt_token_ids = prompt_ids
        choice.token_ids = gen.ids
        out.prompt_token_ids = prompt_ids
    return out


def split_text(text: str, n: int) -> list[str]:
    """Split ``text`` into ``n`` consecutive pieces (some may be empty) whose join is ``text``."""
    if n <= 0:
        return []
    base, extra = divmod(len(text), n)
    out, pos = [], 0
    for i in range(n):
        size = base + (1 if i < extra else 0)
        out.append(text[pos : pos + size])
        pos += size
    return out


def normalise_tool_calls(calls: list[Any] | None) -> list[dict[str, Any]]:
    """OpenAI tool-call dicts (with ids) from dicts or (name, arguments) pairs."""
    out: list[dict[str, Any]] = []
    for i, c in enumerate(calls or []):
        if isinstance(c, tuple):
            name, args = c
            c = {
                "function": {
                    "name": name,
                    "arguments": args if isinstance(args, str) else _json_encode(args).decode(),
                }
            }
        c: dict[str, Any] = dict(c)
        c.setdefault("id", f"call_{i}_{uuid.uuid4().hex[:8]}")
        c.setdefault("type", "function")
        out.append(c)
    return out


def default_text(body: dict[str, Any]) -> str:
    """The reply without a responder: an echo of the last message (or of the prompt's tail)."""
    messages = body.get("messages")
    if isinstance(messages, list) and messages:
        last = messages[-1]
        return f"echo: {text_of(last.get('content') if isinstance(last, dict) else last)}"
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return f"echo: {prompt[-32:]}"
    return f"echo: {len(prompt) if isinstance(prompt, list) else 0} tokens"
