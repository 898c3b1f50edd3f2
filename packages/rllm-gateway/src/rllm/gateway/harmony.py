"""gpt-oss replies in the harmony format, parsed from the model's own tokenizer.

A harmony completion (after the generation prompt ``<|start|>assistant``) is a run of messages,
each ``HEADER<|message|>BODY`` ended by ``<|end|>``, ``<|call|>`` or ``<|return|>``, the next one
opened by ``<|start|>ROLE``. The header names the channel (``<|channel|>analysis``,
``commentary`` or ``final``), a recipient (``to=functions.NAME``, after the channel as the model
writes it, or after the role as gpt-oss's chat template writes it) and a content type
(``<|constrain|>json`` or a bare ``json``).

The completion's ids are decoded with the model's own tokenizer, special tokens kept: no second
vocabulary is needed (``openai-harmony`` would download its o200k file at first use), and any
tokenizer carrying the harmony special tokens parses, a tiny test-time one included.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from rllm.gateway.toolcalls import ParsedReply, openai_tool_call
from rllm.types.errors import InputError

START, MESSAGE, CHANNEL, CONSTRAIN = "<|start|>", "<|message|>", "<|channel|>", "<|constrain|>"
END, CALL, RETURN = "<|end|>", "<|call|>", "<|return|>"
_TERMINATORS = (END, CALL, RETURN)
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")  # a name ends at a space or the next marker
_SPLIT = re.compile(r"(<\|end\|>|<\|call\|>|<\|return\|>)")


@dataclass(slots=True)
class HarmonyMessage:
    role: str
    channel: str | None
    recipient: str | None
    content_type: str | None
    body: str
    terminator: str | None  # None: cut off before its end (max_tokens)


class HarmonyFormatError(InputError):
    """Text that uses the harmony markers but is not a run of harmony messages (parser-internal:
    it becomes the reply's ``tool_call_error``)."""


def split_messages(text: str) -> list[HarmonyMessage]:
    """The messages of a harmony completion; HarmonyFormatError where the structure is broken."""
    out: list[HarmonyMessage] = []
    parts = _SPLIT.split(text)
    # parts alternate: message text, terminator, message text, terminator, ..., trailing text
    for i in range(0, len(parts), 2):
        chunk = parts[i]
        terminator = parts[i + 1] if i + 1 < len(parts) else None
        if terminator is None and not chunk.strip():
            break  # nothing after the last terminator
        if i > 0:
            if not chunk.startswith(START):
                raise HarmonyFormatError(f"text after {parts[i - 1]} does not open a message with {START}")
            chunk = chunk[len(START) :]
        elif chunk.startswith(START):
            chunk = chunk[len(START) :]
        else:
            chunk = "assistant" + chunk  # the generation prompt already wrote the role
        if MESSAGE not in chunk:
            raise HarmonyFormatError(f"a message header without {MESSAGE}: {chunk[:60]!r}")
        header, body = chunk.split(MESSAGE, 1)
        out.append(_message(header, body, terminator))
    return out


def _message(header: str, body: str, terminator: str | None) -> HarmonyMessage:
    role_part, _, channel_part = header.partition(CHANNEL)
    role = role_part.split(" ", 1)[0].strip()
    words = channel_part.replace(CONSTRAIN, " ").split()
    channel = words[0] if words else None
    m = _RECIPIENT.search(header.replace(CONSTRAIN, " "))
    recipient = m.group(1) if m else None
    rest = [w for w in words[1:] if not w.startswith("to=")]
    content_type = rest[0] if rest else None
    return HarmonyMessage(role, channel, recipient, content_type, body, terminator)


def parse_harmony_text(text: str) -> ParsedReply:
    """Content (the ``final`` channel, or a message without channel) and tool calls (messages to
    ``functions.NAME``) of a harmony completion, special tokens written out."""
    if MESSAGE not in text and CHANNEL not in text:
        return ParsedReply(text)
    try:
        messages = split_messages(text)
    except HarmonyFormatError as exc:
        return ParsedReply(text, error=f"unparsable harmony reply: {exc}")
    content: list[str] = []
    calls: list[dict[str, Any]] = []
    for msg in messages:
        if msg.recipient and msg.recipient.startswith("functions."):
            name = msg.recipient.removeprefix("functions.")
            if not name:
                return ParsedReply(text, error="unparsable harmony tool call: no function name after to=")
            if msg.terminator is None:
                return ParsedReply(text, error=f"harmony tool call to {name} was cut off before {CALL}")
            if (msg.content_type or "json") == "json":
                try:
                    json.loads(msg.body)
                except ValueError as exc:
                    return ParsedReply(
                        text, error=f"unparsable harmony tool call arguments for {name}: {exc}"
                    )
            calls.append(openai_tool_call(name, msg.body))
        elif msg.channel in (None, "final"):
            content.append(msg.body)
    return ParsedReply("".join(content), calls)


class HarmonyParser:
    """gpt-oss completions from their token ids, decoded by the model's tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def parse(self, completion_ids: list[int], text: str) -> ParsedReply:
        if not completion_ids:
            return parse_harmony_text(text)
        return parse_harmony_text(self.tokenizer.decode(completion_ids, skip_special_tokens=False))
