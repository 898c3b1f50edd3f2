"""Chat messages in the OpenAI shape: text or content blocks, tool calls, reasoning."""

from __future__ import annotations

from typing import Literal

import msgspec

from rllm.types.errors import InvariantError

Role = Literal["system", "user", "assistant", "tool", "developer"]


class TextBlock(msgspec.Struct, tag="text", tag_field="type", omit_defaults=True):
    text: str


class ImageURL(msgspec.Struct, omit_defaults=True):
    """An image by URL, including ``data:image/png;base64,...`` URIs."""

    url: str
    detail: Literal["auto", "low", "high"] | None = None


class ImageBlock(msgspec.Struct, tag="image_url", tag_field="type", omit_defaults=True):
    image_url: ImageURL


ContentBlock = TextBlock | ImageBlock


class FunctionCall(msgspec.Struct, omit_defaults=True):
    name: str
    arguments: str = "{}"  # JSON text, as the OpenAI API sends it


class ToolCall(msgspec.Struct, omit_defaults=True):
    id: str
    function: FunctionCall
    type: Literal["function"] = "function"


class Message(msgspec.Struct, omit_defaults=True):
    role: Role
    content: str | list[ContentBlock] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    reasoning: str | None = None

    def __post_init__(self) -> None:
        if self.role == "tool" and self.tool_call_id is None:
            raise InvariantError("a tool message needs tool_call_id", "tool_call_id")

    @property
    def text(self) -> str:
        """The message's text, content blocks joined; images are left out."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(b.text for b in self.content if isinstance(b, TextBlock))
