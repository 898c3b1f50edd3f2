"""One tokenizer's tool-call parser: its format (:func:`rllm.gateway.toolcalls.detect_format`)
and the split of a reply into content and OpenAI ``tool_calls``, for every format the gateway
knows (``toolcalls``' parsers; gpt-oss harmony in ``harmony``, which imports ``toolcalls``, so the
dispatch over both lives here)."""

from __future__ import annotations

from typing import Any

from rllm.gateway.harmony import HarmonyParser
from rllm.gateway.toolcalls import (
    HARMONY,
    HERMES,
    LLAMA3_JSON,
    SCHEMA,
    ParsedReply,
    detect_format,
    parse_hermes,
    parse_llama3_json,
    parse_with_schema,
)


class ToolCallParser:
    """One tokenizer's tool-call format (``format``; None: none we parse) and the split of a
    reply in it into content and OpenAI ``tool_calls``: what the cumulative gateway and the local
    sampler server (as vLLM with a tool-call parser) both answer."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.format = detect_format(tokenizer)
        self._harmony: HarmonyParser | None = None  # built on first use

    def parse(self, text: str, completion_ids: list[int] | tuple[int, ...] = ()) -> ParsedReply:
        """``text`` (harmony: the completion's token ids) as content and tool calls."""
        fmt = self.format
        if fmt == HERMES:
            return parse_hermes(self.tokenizer, text)
        if fmt == LLAMA3_JSON:
            return parse_llama3_json(text)
        if fmt == HARMONY:
            if self._harmony is None:
                self._harmony = HarmonyParser(self.tokenizer)
            return self._harmony.parse(list(completion_ids), text)
        if fmt == SCHEMA:
            return parse_with_schema(self.tokenizer, text)
        return ParsedReply(text)
