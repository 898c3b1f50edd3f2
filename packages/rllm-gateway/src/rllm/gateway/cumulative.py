"""Token truth for multi-turn chats (``tokenizer_mode="cumulative"``).

A chat server re-renders and re-tokenizes the whole history every turn. Detokenize→retokenize
is not the identity (a sampler may emit a non-canonical tokenization; normalizers change
text), so turn k+1's prompt tokens may not start with the tokens turn k actually produced:
training on them would credit tokens the model never sampled.

In cumulative mode the gateway renders the chat template itself and sends token ids to
``/v1/completions``. When a request's messages extend the previous turn of the same
(session, role) — same earlier messages, the previous reply unchanged, new messages after
it — only the new part of the rendered text is tokenized and appended to the previous
prompt + completion tokens (or, where the rendered text differs from the sampled text but its
fresh tokenization still starts with exactly the previous prompt + completion ids, that
tokenization). Otherwise (thinking stripped, history compacted, template does
not extend) a new segment starts from a fresh rendering, and the trace says why.

Tool calls: ``tools`` are rendered through the chat template and the completion is parsed back
into OpenAI ``tool_calls`` (:mod:`rllm.gateway.toolcalls`); an assistant message that echoes
the returned content and tool calls extends the token history like a text reply, and the tool
results after it are the new part. A streamed reply comes back as text deltas only (tool calls
are not parsed out of a stream); with ``stream_options.include_usage`` its last chunk before
``[DONE]`` has empty choices and the usage of the whole call (as OpenAI sends it), without it no
chunk has a usage.

Images (a vision-language model whose ``tokenizer_path`` holds its image processor): each
image's placeholder is expanded to the tokens the model's processor gives it
(:mod:`rllm.gateway.image_tokens`), so the prompt ids hold exactly the placeholder tokens the
model sees, and turns extend token for token as for text (an image in a new message expands in
the new part). The images go upstream next to the token ids, in placeholder order, as
``multi_modal_data: {"image": [data URIs]}``; the upstream must answer ``images_used`` (how
many it gave the model), else the call is a 502 rather than an answer the model gave without
seeing the picture. The local tinker sampler does this; vLLM's OpenAI server does not (its
``/v1/completions`` takes no images with token ids), so against vLLM images need plain mode.
A streamed call with images is held in the gateway until the upstream's last chunk confirms
the images, then relayed (a missing confirmation is then still a 502 before any reply).

``TokenBridge`` is the request side (render, tokenize, extend the token history) and
remembers each turn (``commit``); ``rllm.gateway.chat_replies`` shapes the upstream's
completions answer back into the chat answer the agent asked for.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import msgspec

from rllm.gateway.capture import Captured
from rllm.gateway.errors import GatewayError
from rllm.gateway.harmony import HarmonyStream
from rllm.gateway.image_tokens import ImageTokens, PromptImage, prompt_images
from rllm.gateway.tool_parser import ToolCallParser
from rllm.gateway.toolcalls import (
    HARMONY,
    ParsedReply,
    require_format,
    same_tool_calls,
    to_template_messages,
)
from rllm.types import ImageBlock, Message, TraceRecord
from rllm.types.errors import InputError

IMAGES_FIELD = "multi_modal_data"  # request: {"image": [data URIs in placeholder order]}
IMAGES_USED = "images_used"  # response: how many of them the upstream gave the model
# Encoded prompts and rendered chats kept per bridge (TokenBridge.encode, .render): enough for
# every group of a step; texts (render keys) longer than this many characters (bytes) are not
# kept (a few MB at most).
_ENCODE_CACHE_SIZE = 256
_ENCODE_CACHE_MAX_CHARS = 16_384
_json_encode = msgspec.json.Encoder().encode
_json_decode = msgspec.json.Decoder().decode

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
        "stream_options",  # forwarded by prepare when the call streams (the usage chunk)
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
    image_count: int = 0  # images in ``messages`` (a new turn's own images come after them)


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
    images: list[str] = field(default_factory=list)  # data URIs sent upstream, placeholder order
    session: Any = None  # to forget this turn when the upstream did not take its images
    images_used: Any = None  # a stream's confirmation, from the chunk that carried it
    harmony: HarmonyStream | None = None  # a streamed gpt-oss reply's channel splitter
    wants_usage: bool = False  # a stream whose client asked for usage (stream_options.include_usage)


class TokenBridge:
    """One model's chat template and tokenizer: a chat call made a completions call whose
    prompt ids extend its (session, role)'s token history (``prepare``), and each turn's exact
    tokens remembered for the next (``commit``). See the module docstring."""

    def __init__(self, tokenizer: Any, images: ImageTokens | None = None) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise InputError("cumulative mode needs a tokenizer with a chat_template")
        self.tokenizer = tokenizer
        self.images = images  # None: a text-only model, whose image blocks are refused
        self.tool_calls = ToolCallParser(tokenizer)
        self._encode_cached = functools.lru_cache(maxsize=_ENCODE_CACHE_SIZE)(self._encode_uncached)
        self._render_cached = functools.lru_cache(maxsize=_ENCODE_CACHE_SIZE)(self._render_key)

    @classmethod
    def load(cls, path: str) -> TokenBridge:
        """Load a tokenizer (local directory or hub name) with transformers, and the model's
        image processor when it has one (a vision-language model)."""
        from rllm.gateway.tokenizer_load import load_tokenizer

        tokenizer = load_tokenizer(path)
        return cls(tokenizer, ImageTokens.load(path, tokenizer))

    def render(self, messages: list[dict[str, Any]], tools: Any) -> str:
        """The chat template's text for a request's messages and tools (JSON values, as decoded
        from its body).

        A group's rollouts send the same first messages (GRPO: group_size times per task) and a
        Jinja render costs tens of microseconds (a tiny template) to milliseconds (a long chat with
        tools), the JSON encoding a few: renders are kept by the JSON encoding of exactly
        what they read: the messages and the tools, dict order kept (``tojson`` writes keys in
        order; ``1``, ``1.0``, ``true`` and ``"1"`` encode apart). What is rendered on a miss is
        the key decoded again, so a kept render is always the render of its key. Like the
        encode cache, it assumes the template gives the same text for the same inputs (one that
        prints today's date keeps the day it first rendered, consistently in ids and trace).
        """
        try:
            key = _json_encode((messages, tools))
        except (TypeError, ValueError, OverflowError):  # not JSON values: render them as they are
            return self._render(messages, tools)
        if len(key) > _ENCODE_CACHE_MAX_CHARS:
            return self._render(messages, tools)
        return self._render_cached(key)

    def _render(self, messages: list[dict[str, Any]], tools: Any) -> str:
        return self.tokenizer.apply_chat_template(
            to_template_messages(messages), tools=tools, add_generation_prompt=True, tokenize=False
        )

    def _render_key(self, key: bytes) -> str:
        messages, tools = _json_decode(key)
        return self._render(messages, tools)

    def encode(self, text: str) -> list[int]:
        # A group's rollouts send the same first prompt (GRPO: group_size times per task), and
        # transformers' encode is ~0.1-1 ms of Python per call: identical texts are encoded once.
        # A fresh list each time: callers keep and extend what they get.
        if len(text) > _ENCODE_CACHE_MAX_CHARS:
            return self.tokenizer.encode(text, add_special_tokens=False)
        return list(self._encode_cached(text))

    def _encode_uncached(self, text: str) -> tuple[int, ...]:
        return tuple(self.tokenizer.encode(text, add_special_tokens=False))

    def prepare(
        self, session: Any, role: str, body: dict[str, Any], messages: list[Message], trace: TraceRecord
    ) -> BridgePlan:
        """Turn a chat request into a completions request with bridged prompt token ids (in place)."""
        tools = body.get("tools")
        if tools:
            require_format(self.tool_format)
        stream = bool(body.get("stream"))
        images = self._images_of(messages)
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
                new_images = images[prev.image_count :]
                if not text.startswith(done_text):
                    # The text differs (e.g. whitespace a word-level decode drops), yet its fresh
                    # tokens may still start with exactly what was sent and sampled: then it
                    # extends token for token, which is what matters, and stays one segment.
                    fresh = self.encode(self._expand(text, images))
                    done_ids = prev.prompt_ids + prev.completion_ids
                    if fresh[: len(done_ids)] == done_ids:
                        ids = fresh
                    else:
                        reason = "the chat template's rendering does not extend the previous turn's tokens"
                elif self._placeholders(text[len(done_text) :]) != len(new_images):
                    reason = "the new messages' image placeholders do not match their images"
                else:
                    new_part = self._expand(text[len(done_text) :], new_images)
                    ids = prev.prompt_ids + prev.completion_ids + self.encode(new_part)
        if ids is None:
            ids = self.encode(self._expand(text, images))
            segment = 0 if prev is None else prev.segment + 1
            if reason is not None:
                trace.metadata["segment_reason"] = reason
        else:
            segment = prev.segment  # type: ignore[union-attr]
        trace.segment = segment
        wants_ids = bool(body.get("return_token_ids"))
        wants_lp = bool(body.get("logprobs"))
        out = {k: v for k, v in body.items() if k not in _CHAT_ONLY}
        if "max_completion_tokens" in body and "max_tokens" not in body:
            out["max_tokens"] = body["max_completion_tokens"]
        out["prompt"] = ids
        out["stream"] = stream
        options = body.get("stream_options")
        if stream and options is not None:
            # /completions takes stream_options too: its usage chunk (the whole call's counts,
            # empty choices, last before [DONE]) is relayed as the chat stream's, as OpenAI does.
            out["stream_options"] = options
        urls = [image.url for image in images]
        if urls:
            out[IMAGES_FIELD] = {"image": urls}
        body.clear()
        body.update(out)
        plan = BridgePlan(role, messages, text, ids, tools, segment, wants_ids, wants_lp, stream, urls)
        plan.session = session
        plan.wants_usage = stream and isinstance(options, dict) and bool(options.get("include_usage"))
        if stream and self.tool_format == HARMONY:
            plan.harmony = HarmonyStream(self.tokenizer)
        return plan

    def _images_of(self, messages: list[Message]) -> list[PromptImage]:
        """The request's images in placeholder order; a 400 where this bridge cannot place them."""
        if not any(isinstance(m.content, list) and _has_image(m) for m in messages):
            return []
        if self.images is None:
            i, j = _first_image(messages)
            raise GatewayError(
                400,
                "cumulative mode found no image processor at tokenizer_path (a text-only model?), "
                "so it cannot place image tokens: give the vision-language model's directory, or "
                "use tokenizer_mode='plain'",
                param=f"messages[{i}].content[{j}]",
                code="unsupported_content",
            )
        return prompt_images(messages)

    def _placeholders(self, text: str) -> int:
        return 0 if self.images is None else text.count(self.images.image_token)

    def _expand(self, text: str, images: list[PromptImage]) -> str:
        return text if self.images is None else self.images.expand(text, images)

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
        # A harmony reply is channels even without tools, streamed or not (HarmonyStream sent
        # the agent the same split): the agent gets the final channel.
        if (plan.tools and not plan.stream) or self.tool_format == HARMONY:
            parsed = self.parse_tools(cap)
            cap.text, cap.tool_calls = parsed.content, parsed.tool_calls
            cap.reasoning = parsed.reasoning or cap.reasoning
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
            image_count=len(plan.images),
        )

    @property
    def tool_format(self) -> str | None:
        """This model's tool-call format (None: none we parse)."""
        return self.tool_calls.format

    def parse_tools(self, cap: Captured) -> ParsedReply:
        """Split the completion into content and OpenAI tool_calls in this model's format."""
        return self.tool_calls.parse(cap.text, cap.completion_ids or ())


def _has_image(message: Message) -> bool:
    return any(isinstance(block, ImageBlock) for block in message.content or ())


def _first_image(messages: list[Message]) -> tuple[int, int]:
    for i, msg in enumerate(messages):
        if isinstance(msg.content, list):
            for j, block in enumerate(msg.content):
                if isinstance(block, ImageBlock):
                    return i, j
    return 0, 0
