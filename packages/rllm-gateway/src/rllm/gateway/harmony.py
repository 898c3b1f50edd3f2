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
# gpt-oss's harmony special tokens, in its vocabulary's order (tests build tiny tokenizers with them)
SPECIAL_TOKENS = (START, END, MESSAGE, CHANNEL, CONSTRAIN, RETURN, CALL)
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
    reasoning: list[str] = []
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
        elif msg.channel == "analysis":
            reasoning.append(msg.body)
    return ParsedReply("".join(content), calls, reasoning="".join(reasoning))


class HarmonyParser:
    """gpt-oss completions from their token ids, decoded by the model's tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def parse(self, completion_ids: list[int], text: str) -> ParsedReply:
        if not completion_ids:
            return parse_harmony_text(text)
        return parse_harmony_text(self.tokenizer.decode(completion_ids, skip_special_tokens=False))


class HarmonyStream:
    """A streamed gpt-oss completion split into chat deltas as its token ids arrive: the final
    channel as ``content``, analysis as ``reasoning_content``, each ``to=functions.NAME`` message
    as one ``tool_calls`` entry once its ``<|call|>`` came; headers and special tokens never as
    text. Only what the client sees changes: the ids themselves are captured untouched.

    The ids are decoded incrementally (each new run of ids decoded after the run before it,
    as vLLM's detokenizer does, so a long message costs linear time) and the text is split as
    text (a sampler that spelled a marker out in ordinary tokens parses too); text that may
    still become a marker, or ends in a partly decoded character, is held back. Messages are
    classified as ``parse_harmony_text`` does, so the streamed message equals the non-streamed
    one; a malformed call (arguments not JSON) is sent as it is, and the trace's
    ``tool_call_error`` says what the non-streamed parse made of it."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._ids: list[int] = []
        self._prefix = self._read = 0  # ids decoded as context / ids whose text is in _text
        self._text = ""  # the completion's text so far, special tokens written out
        self._start = 0  # where the open message starts in _text
        self._messages = 0  # messages finished
        self._sent = 0  # body characters of the open message already sent
        self._calls = 0

    @property
    def calls(self) -> int:
        """How many tool calls were sent so far."""
        return self._calls

    def feed(self, ids: list[int]) -> dict[str, Any]:
        """The chat delta for the next ids (empty while nothing new is visible)."""
        delta: dict[str, Any] = {}
        self._ids.extend(ids)
        decode = self.tokenizer.decode
        # The run before gives the new ids their context (a leading space, a split character).
        before = decode(self._ids[self._prefix : self._read], skip_special_tokens=False)
        upto = decode(self._ids[self._prefix :], skip_special_tokens=False)
        if len(upto) > len(before) and not upto.endswith("\ufffd"):
            self._text += upto[len(before) :]
            self._prefix, self._read = self._read, len(self._ids)
        parts = _SPLIT.split(self._text[self._start :])
        for i in range(0, len(parts), 2):
            terminator = parts[i + 1] if i + 1 < len(parts) else None
            self._message_delta(delta, parts[i], terminator)
            if terminator is None:
                break
            self._start += len(parts[i]) + len(terminator)
            self._messages, self._sent = self._messages + 1, 0
        return delta

    def _message_delta(self, delta: dict[str, Any], text: str, terminator: str | None) -> None:
        first = self._messages == 0  # the generation prompt wrote its role
        text = text.removeprefix(START)
        if MESSAGE not in text:
            return  # the header is still being written (or a broken message: nothing to show)
        header, body = text.split(MESSAGE, 1)
        msg = _message(("assistant" if first else "") + header, body, terminator)
        if msg.recipient and msg.recipient.startswith("functions."):
            if terminator is not None:
                call = openai_tool_call(msg.recipient.removeprefix("functions."), body)
                delta.setdefault("tool_calls", []).append({"index": self._calls, **call})
                self._calls += 1
            return
        key = {None: "content", "final": "content", "analysis": "reasoning_content"}.get(msg.channel)
        if key is None:
            return  # commentary preambles and other recipients: not part of the message
        if terminator is None:
            body = _held_back(body)
        if len(body) > self._sent:
            delta[key] = delta.get(key, "") + body[self._sent :]
            self._sent = len(body)


def _held_back(body: str) -> str:
    """An open message's body less what may still change: a character whose bytes have not all
    come (decoded as U+FFFD) and a tail that may grow into a terminator."""
    body = body.rstrip("\ufffd")
    for k in range(min(len(body), max(map(len, _TERMINATORS)) - 1), 0, -1):
        if any(end.startswith(body[-k:]) for end in _TERMINATORS):
            return body[:-k]
    return body
