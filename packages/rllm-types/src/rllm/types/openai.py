"""OpenAI-compatible response and error bodies, with vLLM's token-id fields.

One builder for every part of rLLM that answers like an OpenAI endpoint: the local sampler
server, the gateway's errors and the test fakes. The Structs encode (``msgspec.json``) to the
JSON the ``openai`` client parses. vLLM's extensions, which a client asks for with
``return_token_ids`` (``prompt_token_ids`` at the top level, ``choices[i].token_ids``), and
rLLM's ``weight_version`` (the sampler weights that produced a reply) are left out of the JSON
unless they are set.

Every Struct is keyword-only: ``ChatChoice(index=0, message=..., finish_reason="stop")``.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from rllm.types.errors import InputError

# ---------------------------------------------------------------------------------- errors

# The ``type`` of an error body per HTTP status; other statuses map by class (see error_type).
ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}


def error_type(status: int) -> str:
    """The OpenAI error ``type`` for an HTTP status: the table, else server/client error by class."""
    found = ERROR_TYPES.get(status)
    if found is not None:
        return found
    return "server_error" if status >= 500 else "invalid_request_error"


class ErrorDetail(msgspec.Struct, kw_only=True):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(msgspec.Struct, kw_only=True):
    """``{"error": {"message", "type", "param", "code"}}``, what the openai client raises from."""

    error: ErrorDetail


def error_body(status: int, message: str, *, param: str | None = None, code: str | None = None) -> ErrorBody:
    """The error body for ``status``; ``code`` defaults to the status as a string."""
    if not isinstance(status, int) or isinstance(status, bool) or not 100 <= status <= 599:
        raise InputError(f"error_body: status must be an HTTP status code (100-599), got {status!r}")
    return ErrorBody(
        error=ErrorDetail(message=message, type=error_type(status), param=param, code=code or str(status))
    )


# ---------------------------------------------------------------------------------- ids, usage

# Response ids look like uuid4 hex (32 hex digits) but cost a counter step, not an os.urandom
# call: a random per-process prefix keeps the ids of two processes apart.
_ID_PREFIX = os.urandom(10).hex()
_id_counter = itertools.count()


def _new_id_prefix() -> None:
    """A forked child draws its own prefix: it would otherwise repeat its parent's ids."""
    global _ID_PREFIX, _id_counter
    _ID_PREFIX = os.urandom(10).hex()
    _id_counter = itertools.count()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_id_prefix)


def response_id(kind: str) -> str:
    """A new, process-unique response id such as ``chatcmpl-<32 hex digits>``."""
    return f"{kind}-{_ID_PREFIX}{next(_id_counter) & 0xFFFFFFFFFFFF:012x}"


def _now() -> int:
    return int(time.time())


class CompletionUsage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


def usage(prompt_tokens: int, completion_tokens: int) -> CompletionUsage:
    """Token counts of one response (``total_tokens`` is their sum)."""
    return CompletionUsage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
    )


# ---------------------------------------------------------------------------------- logprobs


class TopLogprob(msgspec.Struct, kw_only=True):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(msgspec.Struct, kw_only=True):
    """One sampled token of a chat reply's ``logprobs.content``."""

    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[TopLogprob] = []


def token_logprob(token: str, logprob: float, top: Iterable[tuple[str, float]] = ()) -> TokenLogprob:
    """A chat logprob entry; ``bytes`` are the token text's UTF-8 bytes, ``top`` (text, logprob) pairs."""
    return TokenLogprob(
        token=token,
        logprob=logprob,
        bytes=list(token.encode()),
        top_logprobs=[TopLogprob(token=t, logprob=v, bytes=list(t.encode())) for t, v in top],
    )


class ChatLogprobs(msgspec.Struct, kw_only=True):
    """``choices[i].logprobs`` of a chat reply. ``content`` may be pre-encoded JSON (a
    ``msgspec.Raw`` list), for servers that cache the entries of tokens they send again."""

    content: list[TokenLogprob] | msgspec.Raw | None


class CompletionLogprobs(msgspec.Struct, kw_only=True):
    """``choices[i].logprobs`` of a text completion (the legacy per-list shape)."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None
    text_offset: list[int]


def completion_logprobs(
    tokens: Sequence[str], logprobs: Sequence[float], top: Sequence[dict[str, float]] | None = None
) -> CompletionLogprobs:
    """Completion logprobs of ``tokens`` (texts); ``text_offset`` is each token's start in the text."""
    if len(tokens) != len(logprobs) or (top is not None and len(top) != len(tokens)):
        raise InputError(
            f"completion_logprobs: {len(tokens)} tokens but {len(logprobs)} logprobs"
            + ("" if top is None else f" and {len(top)} top_logprobs")
        )
    offsets, at = [], 0
    for t in tokens:
        offsets.append(at)
        at += len(t)
    return CompletionLogprobs(
        tokens=list(tokens),
        token_logprobs=list(logprobs),
        top_logprobs=None if top is None else list(top),
        text_offset=offsets,
    )


# ---------------------------------------------------------------------------------- chat


class AssistantMessage(msgspec.Struct, kw_only=True):
    """The reply of a chat choice; ``tool_calls`` are OpenAI tool-call objects (dicts). vLLM
    always sends ``refusal`` and ``tool_calls``; a server that does not leaves them unset."""

    role: str = "assistant"
    content: str | None = None
    refusal: str | UnsetType | None = UNSET
    tool_calls: list[dict[str, Any]] | UnsetType = UNSET


class ChatChoice(msgspec.Struct, kw_only=True):
    index: int
    message: AssistantMessage
    finish_reason: str | None
    logprobs: ChatLogprobs | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | UnsetType = UNSET


class ChatCompletion(msgspec.Struct, kw_only=True):
    """A whole ``chat.completion`` response."""

    id: str
    object: str = "chat.completion"
    created: int = msgspec.field(default_factory=_now)
    model: str
    choices: list[ChatChoice]
    usage: CompletionUsage
    prompt_logprobs: None = None
    prompt_token_ids: list[int] | UnsetType = UNSET
    weight_version: int | UnsetType = UNSET


class ChatDelta(msgspec.Struct, kw_only=True):
    """What one streamed chunk adds to the reply; unset fields are left out."""

    role: str | UnsetType = UNSET
    content: str | UnsetType = UNSET
    tool_calls: list[dict[str, Any]] | UnsetType = UNSET


class ChatChunkChoice(msgspec.Struct, kw_only=True):
    index: int = 0
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    token_ids: list[int] | UnsetType = UNSET


class ChatCompletionChunk(msgspec.Struct, kw_only=True):
    """One ``chat.completion.chunk`` of a stream (the last one may carry only ``usage``)."""

    id: str
    object: str = "chat.completion.chunk"
    created: int = msgspec.field(default_factory=_now)
    model: str
    choices: list[ChatChunkChoice]
    usage: CompletionUsage | UnsetType = UNSET
    prompt_token_ids: list[int] | UnsetType = UNSET


# ---------------------------------------------------------------------------------- completions


class CompletionChoice(msgspec.Struct, kw_only=True):
    index: int
    text: str
    finish_reason: str | None
    logprobs: CompletionLogprobs | None = None
    stop_reason: int | str | None = None
    prompt_token_ids: list[int] | UnsetType = UNSET
    token_ids: list[int] | UnsetType = UNSET


class Completion(msgspec.Struct, kw_only=True):
    """A ``text_completion`` response, whole or one chunk of a stream (then ``usage`` is unset
    but on the last chunk)."""

    id: str
    object: str = "text_completion"
    created: int = msgspec.field(default_factory=_now)
    model: str
    choices: list[CompletionChoice]
    usage: CompletionUsage | UnsetType = UNSET
    prompt_token_ids: list[int] | UnsetType = UNSET
    weight_version: int | UnsetType = UNSET


__all__ = [
    "ERROR_TYPES",
    "AssistantMessage",
    "ChatChoice",
    "ChatChunkChoice",
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatDelta",
    "ChatLogprobs",
    "Completion",
    "CompletionChoice",
    "CompletionLogprobs",
    "CompletionUsage",
    "ErrorBody",
    "ErrorDetail",
    "TokenLogprob",
    "TopLogprob",
    "completion_logprobs",
    "error_body",
    "error_type",
    "response_id",
    "token_logprob",
    "usage",
]
