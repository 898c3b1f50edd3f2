"""Native tool calls in cumulative mode: which format a model writes, and parsing it back.

Cumulative mode renders the chat template itself and samples through ``/v1/completions``, so
the reply is raw text; an agent using OpenAI function calling needs ``tool_calls`` back. The
format is found from the tokenizer:

- a tokenizer that ships a ``response_schema`` is parsed by transformers' own
  ``parse_response`` (the model author's schema);
- ``hermes``: ``<tool_call>{json}</tool_call>`` blocks (Qwen2.5, Qwen3), parsed with transformers'
  schema parser;
- ``llama3_json``: Llama-3.1's bare ``{"name": ..., "parameters": ...}`` reply, optionally after
  ``<|python_tag|>``;
- ``harmony``: gpt-oss, its completion's token ids decoded by the model's tokenizer and split
  into channels and ``to=functions.NAME`` calls (:mod:`rllm.gateway.harmony`).

A request with ``tools`` for a template of none of these families is refused (400), never
answered with tool calls silently left in the text.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from rllm.gateway.errors import GatewayError
from rllm.types.errors import InputError

HERMES = "hermes"
LLAMA3_JSON = "llama3_json"
HARMONY = "harmony"
SCHEMA = "response_schema"

# A one-function tool list for probing a template's tool-call format: `rllm doctor tokens` sends
# it, and the gateway's tool-call tests use the same definition.
PROBE_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]

# transformers' response-schema language: every <tool_call> block, each parsed as JSON.
_HERMES_SCHEMA = {
    "type": "array",
    "x-regex-iterator": r"<tool_call>\s*(.*?)\s*</tool_call>",
    "items": {"type": "object", "x-parser": "json"},
}


@dataclass(slots=True)
class ParsedReply:
    """A completion split into the assistant message's content and its OpenAI tool_calls."""

    content: str
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None  # why text that looked like a tool call was left as content
    reasoning: str = ""  # a harmony reply's analysis channel


def detect_format(tokenizer: Any) -> str | None:
    """The tool-call format of a tokenizer's chat template, or None when it is not one we parse."""
    if getattr(tokenizer, "response_schema", None):
        return SCHEMA
    template = tokenizer.chat_template
    if isinstance(template, dict):
        template = template.get("tool_use") or template.get("default") or ""
    template = str(template or "")
    if "<|channel|>" in template and "<|call|>" in template:
        return HARMONY
    if "<tool_call>" in template:
        return HERMES
    if "<|start_header_id|>" in template and '"parameters": ' in template:
        return LLAMA3_JSON
    return None


# Why a request with ``tools`` is refused for a model of no parsed family: the cumulative
# gateway's 400 and the local sampler server's (``rllm serve``) say the same.
UNSUPPORTED_TOOLS = (
    "tools: this model's tool calls cannot be parsed (its chat template is not hermes "
    "<tool_call>, Llama-3.1 JSON or gpt-oss harmony, and the tokenizer has no response_schema)"
)


def require_format(fmt: str | None) -> str:
    """The format, or a 400 saying that this model's tool calls cannot be parsed."""
    if fmt is None:
        raise GatewayError(400, UNSUPPORTED_TOOLS, code="unsupported_tool_format")
    return fmt


def openai_tool_call(name: str, arguments: Any) -> dict[str, Any]:
    """One OpenAI ``tool_calls`` entry; arguments become JSON text as the API sends them."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {
        "id": "call_" + uuid.uuid4().hex[:24],
        "type": "function",
        "function": {"name": name, "arguments": args},
    }


def tool_calls_from_dicts(calls: Any) -> list[dict[str, Any]]:
    out = []
    for call in calls or ():
        if not isinstance(call, dict):
            raise InputError("a tool call is not a JSON object")
        nested = call.get("function")
        fn: dict[str, Any] = nested if isinstance(nested, dict) else call
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise InputError("a tool call has no name")
        args = fn.get("arguments", fn.get("parameters", {}))
        out.append(openai_tool_call(name, args if args is not None else {}))
    return out


def parse_with_schema(tokenizer: Any, text: str) -> ParsedReply:
    """Parse with the tokenizer's own ``response_schema`` (transformers' ``parse_response``)."""
    try:
        parsed = tokenizer.parse_response(text) or {}
        return ParsedReply(str(parsed.get("content") or ""), tool_calls_from_dicts(parsed.get("tool_calls")))
    except (ValueError, TypeError) as exc:
        return ParsedReply(text, error=f"response_schema did not parse: {str(exc).splitlines()[0]}")


def parse_hermes(tokenizer: Any, text: str) -> ParsedReply:
    if "<tool_call>" not in text:
        return ParsedReply(text)
    head = text.split("<tool_call>", 1)[0].strip()
    try:
        calls = tool_calls_from_dicts(tokenizer.parse_response(text, schema=_HERMES_SCHEMA))
        # No complete block (e.g. cut off by max_tokens): the text stays as the model wrote it.
        return ParsedReply(head, calls) if calls else ParsedReply(text)
    except (ValueError, TypeError) as exc:
        return ParsedReply(text, error=f"unparsable <tool_call>: {str(exc).splitlines()[0]}")


def parse_llama3_json(text: str) -> ParsedReply:
    body = text.strip().removeprefix("<|python_tag|>").strip()
    if not body.startswith("{"):
        return ParsedReply(text)
    try:
        obj = json.loads(body)
        if "name" not in obj or not ({"parameters", "arguments"} & obj.keys()):
            return ParsedReply(text)  # JSON as an answer, not a call
        return ParsedReply("", tool_calls_from_dicts([obj]))
    except (ValueError, TypeError, AttributeError) as exc:
        return ParsedReply(text, error=f"unparsable Llama-3.1 tool call: {exc}")


def to_template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as chat templates expect them: tool-call arguments as objects, not JSON text.

    The OpenAI API carries ``arguments`` as a JSON string while templates ``tojson`` them; a
    string would render quoted and never match what the model wrote (vLLM converts them too).
    """
    out = []
    for message in messages:
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        if not calls:
            out.append(message)
            continue
        fixed = []
        for call in calls:
            fn = dict(call.get("function") or {})
            if isinstance(fn.get("arguments"), str):
                try:
                    fn["arguments"] = json.loads(fn["arguments"])
                except ValueError:
                    pass  # leave text the model wrote as it is
            fixed.append({**call, "function": fn})
        out.append({**message, "tool_calls": fixed})
    return out


def same_tool_calls(sent: list[Any] | None, returned: list[dict[str, Any]]) -> bool:
    """Whether an agent echoed the tool calls we returned (ids, names and arguments)."""
    sent = sent or []
    if len(sent) != len(returned):
        return False
    for a, b in zip(sent, returned, strict=True):
        if a.id != b["id"] or a.function.name != b["function"]["name"]:
            return False
        if _as_obj(a.function.arguments) != _as_obj(b["function"]["arguments"]):
            return False
    return True


def _as_obj(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments
