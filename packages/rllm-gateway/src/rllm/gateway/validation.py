"""Decoding and validating request bodies: every refusal is a 400 naming the field.

A proxy call's body goes upstream as it came, so only what a trace keeps is checked deeply:
messages are converted to typed ``Message``s (which admits only strings and typed blocks, so
they need no depth walk), tools and a prompt are checked against the JSON limits, sampling
numbers against their types and int64. Admin bodies are kept whole, so all of them is checked.
"""

from __future__ import annotations

from array import array
from typing import Any

import msgspec

from rllm.gateway.errors import GatewayError
from rllm.gateway.jsonguard import JsonLimitError, check_json, fits_int64
from rllm.types import Message, SchemaError, convert
from rllm.types.images import ImageError, ImageLimits, check_message_images

_json_decode = msgspec.json.Decoder().decode
_NUMBERS = (
    ("temperature", (int, float)),
    ("top_p", (int, float)),
    ("max_tokens", (int,)),
    ("n", (int,)),
    ("seed", (int,)),
)


class RequestValidator:
    """The body checks of one gateway (its JSON depth limit, image limits and ``store_raw``)."""

    __slots__ = ("image_limits", "max_json_depth", "store_raw")

    def __init__(self, *, max_json_depth: int, image_limits: ImageLimits, store_raw: bool) -> None:
        self.max_json_depth = max_json_depth
        self.image_limits = image_limits
        self.store_raw = store_raw

    def decode(self, raw: bytes, *, whole: bool = False) -> dict[str, Any]:
        """The request's JSON object. ``whole``: every part of it must fit the JSON limits (admin
        bodies, kept as they are); proxy calls check only the parts a trace keeps (``validate_call``)."""
        if not raw:
            raise GatewayError(400, "request body is empty; expected a JSON object", code="invalid_json")
        try:
            body = _json_decode(raw)
        except msgspec.DecodeError as exc:
            raise GatewayError(400, f"malformed JSON in request body: {exc}", code="invalid_json") from None
        except RecursionError:
            raise GatewayError(400, "JSON in request body is nested too deep", code="invalid_json") from None
        if whole or self.store_raw:
            self.check_json(body, "")
        if not isinstance(body, dict):
            raise GatewayError(
                400, f"request body must be a JSON object, got {type(body).__name__}", code="invalid_json"
            )
        return body

    def check_json(self, value: Any, where: str) -> None:
        """400 naming the place where ``value`` (found at ``where``) breaks the JSON limits."""
        try:
            check_json(value, self.max_json_depth, where)
        except JsonLimitError as exc:
            raise GatewayError(
                400, f"{exc.message} at {exc.path}", param=exc.path, code="invalid_json"
            ) from None

    def validate_call(self, body: dict[str, Any], chat: bool) -> list[Message]:
        """Check a chat (``messages``) or completions (``prompt``) body; the typed messages of a
        chat call (none for completions)."""
        if "stream" in body and not isinstance(body["stream"], bool):
            raise GatewayError(400, "'stream' must be a boolean", param="stream", code="invalid_type")
        for name, types in _NUMBERS:
            v = body.get(name)
            if v is not None and (not isinstance(v, types) or isinstance(v, bool)):
                raise GatewayError(
                    400, f"'{name}' must be a number, got {type(v).__name__}", param=name, code="invalid_type"
                )
            if type(v) is int and not fits_int64(v):
                raise GatewayError(400, f"'{name}' does not fit in 64 bits", param=name, code="invalid_type")
        if body.get("n", 1) not in (None, 1):
            raise GatewayError(400, "the gateway captures one choice per call: 'n' must be 1", param="n")
        if chat:
            if body.get("tools"):
                self.check_json(body["tools"], "tools")
            return self._messages(body)
        self._prompt(body)
        return []

    def _messages(self, body: dict[str, Any]) -> list[Message]:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise GatewayError(
                400, "'messages' must be a non-empty list of messages", param="messages", code="invalid_type"
            )
        try:
            messages = convert(msgs, list[Message])
        except SchemaError as exc:
            raise GatewayError(
                400,
                f"invalid message: {exc.reason}",
                param=f"messages{_bracket(exc.path)}",
                code="invalid_type",
            ) from None
        try:
            check_message_images(messages, self.image_limits)
        except ImageError as exc:
            where = f"messages{exc.field}"
            raise GatewayError(
                400, f"invalid image at {where}: {exc.reason}", param=where, code="invalid_image"
            ) from None
        return messages

    @staticmethod
    def _prompt(body: dict[str, Any]) -> None:
        prompt = body.get("prompt")
        ok = isinstance(prompt, str) or (
            isinstance(prompt, list)
            and prompt
            and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
        )
        if not ok:
            raise GatewayError(
                400,
                "'prompt' must be a string or a non-empty list of token ids",
                param="prompt",
                code="invalid_type",
            )
        if isinstance(prompt, list):
            try:
                array("q").fromlist(prompt)  # C-speed int64 check of every token id
            except OverflowError:
                raise GatewayError(
                    400, "a token id in 'prompt' does not fit in 64 bits", param="prompt", code="invalid_type"
                ) from None


def _bracket(path: str) -> str:
    # "[2].content" -> "[2].content"; "content" -> ".content"; "" -> ""
    return path if path.startswith("[") or not path else f".{path}"


__all__ = ["RequestValidator"]
