"""Building a call's trace: started from the accepted request, filled from what was captured.

Token ids and logprobs are packed into arrays (``TokenArray`` / ``FloatArray``) as they go in,
so a trace holds them compactly and encodes them to msgpack without a per-item walk.
"""

from __future__ import annotations

from array import array
from typing import Any, TypeVar

from rllm.gateway.capture import Captured
from rllm.gateway.sessions import Session
from rllm.types import FloatArray, FunctionCall, Message, TokenArray, ToolCall, TraceRecord, Usage
from rllm.types.errors import UsageError
from rllm.types.images import intern_images

_A = TypeVar("_A", bound=array)


def start_trace(
    session: Session,
    role: str,
    body: dict[str, Any],
    messages: list[Message],
    *,
    chat: bool,
    weight_version: int,
    store_raw: bool,
    policy: str | None = None,
) -> TraceRecord:
    """The trace of an accepted call before it is sent: takes the session's next ``seq`` and
    keeps the request's parts a trace holds (messages with images by content address, tools,
    the prompt, the whole body with ``store_raw``)."""
    seq = session.next_seq
    session.next_seq = seq + 1
    images: dict[str, str] = {}
    if chat:
        messages, images = intern_images(messages, session.images)
    trace = TraceRecord(
        session_id=session.session_id,
        role=role,
        seq=seq,
        messages=messages,
        weight_version=weight_version,
        model=body.get("model") or "",
        images=images,
        policy=policy,
    )
    if chat and body.get("tools"):
        trace.metadata["tools"] = body["tools"]
    if not chat:
        trace.metadata["prompt"] = body["prompt"]
    if store_raw:
        trace.raw_request = dict(body)
    return trace


def fill_trace(trace: TraceRecord, cap: Captured) -> None:
    """Copy what was captured into the trace, tolerating upstreams that omit parts."""
    if cap.model:
        trace.model = cap.model
    tool_calls = None
    if cap.tool_calls:
        try:
            tool_calls = [
                ToolCall(
                    id=str(tc.get("id") or f"call_{i}"),
                    function=FunctionCall(
                        name=_text(tc["function"]["name"]),
                        arguments=_text(tc["function"].get("arguments") or "{}"),
                    ),
                )
                for i, tc in enumerate(cap.tool_calls)
            ]
        except (KeyError, TypeError, AttributeError):
            trace.metadata["capture_warning"] = "unreadable tool_calls"
    trace.response = Message(
        role="assistant", content=cap.text or None, tool_calls=tool_calls, reasoning=cap.reasoning or None
    )
    trace.finish_reason = cap.finish_reason
    ids = cap.completion_ids
    lps = cap.completion_logprobs
    if cap.prompt_ids is not None:
        trace.prompt_ids = _tokens(cap.prompt_ids)
    if ids:
        trace.completion_ids = _tokens(ids)
        if lps and len(lps) == len(ids):
            trace.completion_logprobs = _packed(FloatArray, "f", lps)
        elif lps:
            trace.metadata["capture_warning"] = f"{len(lps)} logprobs for {len(ids)} tokens; logprobs dropped"
    u = cap.usage
    if isinstance(u, dict):
        trace.usage = Usage(
            prompt_tokens=u.get("prompt_tokens") or 0,
            completion_tokens=u.get("completion_tokens") or 0,
            total_tokens=u.get("total_tokens") or 0,
        )
    elif trace.prompt_ids is not None or trace.completion_ids is not None:
        p = len(trace.prompt_ids or ())
        c = len(trace.completion_ids or ())
        trace.usage = Usage(prompt_tokens=p, completion_tokens=c, total_tokens=p + c)


def _text(value: Any) -> str:
    # A trace holds what it can encode: anything but a string here is an unreadable tool call.
    if not isinstance(value, str):
        raise UsageError(f"expected a string, got {type(value).__name__}")
    return value


def _tokens(ids: list[int]) -> Any:
    return _packed(TokenArray, "i", ids)


def _packed(cls: type[_A], typecode: str, values: Any) -> _A:
    # array.fromlist is faster than the generic extend() the constructors use (figure in
    # benchmarks/history/issue-14.md, "Figures moved out of code comments"); it only takes a list
    # (what JSON decoding gives), so anything else goes through cls(values).
    if type(values) is list:
        out = array.__new__(cls, typecode)
        out.fromlist(values)
        return out
    return cls(values)


__all__ = ["fill_trace", "start_trace"]
