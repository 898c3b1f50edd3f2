"""Capture: what the gateway adds to a request and reads back from an upstream's response.

vLLM returns token ids when asked (``return_token_ids: true``): ``prompt_token_ids`` at the top
level (chat) or in the choice (completions), and ``choices[i].token_ids``. Logprobs come as
``logprobs.content[].logprob`` (chat) or ``logprobs.token_logprobs`` (completions). SGLang's
native names (``meta_info.input_token_ids`` / ``output_token_logprobs`` as ``[logprob, id, text]``
triples, ``output_ids``) are read too. Whatever the gateway injected is stripped before the
response reaches the client, so an agent sees a normal OpenAI response.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any

from rllm.types import SamplingParams
from rllm.types.errors import RLLMError, UsageError

SAMPLING_FIELDS = ("temperature", "top_p", "max_tokens", "stop", "seed")


@dataclass(slots=True)
class ClientWants:
    """What the client itself asked for, so injected fields can be removed again."""

    logprobs: bool
    token_ids: bool
    usage_chunk: bool = False


def apply_sampling(body: dict[str, Any], sampling: SamplingParams | None, call_index: int = 0) -> None:
    """Session sampling parameters override the client's (the trainer decides, not the agent).

    A session's ``seed`` is the seed of its first call; call ``k`` gets ``seed + k``. One seed for
    every call would make a seeded sampler repeat itself within a session: N candidates of a V1
    flow, or a retried turn, would all be the same text.
    """
    if sampling is None:
        return
    for name in SAMPLING_FIELDS:
        value = getattr(sampling, name)
        if value is not None:
            body[name] = value + call_index if name == "seed" else value
            if name == "max_tokens":
                body.pop("max_completion_tokens", None)


def inject_capture(body: dict[str, Any], *, chat: bool, stream: bool) -> ClientWants:
    """Ask the upstream for token ids and logprobs; remember what the client wanted itself."""
    wants = ClientWants(logprobs=bool(body.get("logprobs")), token_ids=bool(body.get("return_token_ids")))
    if chat:
        body["logprobs"] = True
    elif body.get("logprobs") in (None, False, 0):
        body["logprobs"] = 1
        wants.logprobs = False
    body["return_token_ids"] = True
    if stream:
        opts = body.get("stream_options")
        wants.usage_chunk = bool(isinstance(opts, dict) and opts.get("include_usage"))
    return wants


@dataclass(slots=True)
class Captured:
    """The capture fields of one response (first choice), chat or completions, whole or streamed."""

    prompt_ids: list[int] | None = None
    completion_ids: list[int] | None = None
    completion_logprobs: list[float] | None = None
    text: str = ""
    reasoning: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    model: str = ""


def _sglang_meta(resp: dict[str, Any], choice: dict[str, Any], cap: Captured) -> None:
    meta = choice.get("meta_info") or resp.get("meta_info")
    if not isinstance(meta, dict):
        return
    if cap.prompt_ids is None and isinstance(meta.get("input_token_ids"), list):
        cap.prompt_ids = meta["input_token_ids"]
    out = meta.get("output_token_logprobs")
    if isinstance(out, list) and out and isinstance(out[0], list | tuple):
        if cap.completion_logprobs is None:
            cap.completion_logprobs = [float(t[0]) for t in out]
        if cap.completion_ids is None:
            cap.completion_ids = [int(t[1]) for t in out]


def _logprobs_of(lp: Any) -> list[float] | None:
    if not isinstance(lp, dict):
        return None
    content = lp.get("content")
    if isinstance(content, list):
        return [float(e["logprob"]) for e in content]
    token_logprobs = lp.get("token_logprobs")
    if isinstance(token_logprobs, list):
        return [float(x) if x is not None else 0.0 for x in token_logprobs]
    return None


def capture_response(resp: dict[str, Any], *, chat: bool) -> Captured:
    """Read the first choice's tokens, logprobs, text and tool calls from a whole response."""
    cap = Captured(model=resp.get("model") or "")
    choices = resp.get("choices") or []
    cap.usage = resp.get("usage")
    if not choices:
        return cap
    choice = choices[0]
    cap.prompt_ids = resp.get("prompt_token_ids") or choice.get("prompt_token_ids")
    cap.completion_ids = choice.get("token_ids") or choice.get("output_ids")
    cap.completion_logprobs = _logprobs_of(choice.get("logprobs"))
    cap.finish_reason = choice.get("finish_reason")
    if chat:
        msg = choice.get("message") or {}
        cap.text = msg.get("content") or ""
        cap.reasoning = msg.get("reasoning_content") or msg.get("reasoning") or ""
        cap.tool_calls = msg.get("tool_calls") or []
    else:
        cap.text = choice.get("text") or ""
    _sglang_meta(resp, choice, cap)
    return cap


class UpstreamShapeError(RLLMError, ValueError):
    """The upstream answered valid JSON of the wrong shape; the message names what was wrong."""


_UNREADABLE = (AttributeError, TypeError, KeyError, ValueError, IndexError)


def read_answer(resp: Any, *, chat: bool) -> Captured:
    """``capture_response`` for an answer nobody has checked yet: raises UpstreamShapeError
    (naming the field) instead of whatever reading the wrong shape would raise."""
    if not isinstance(resp, dict):
        raise UpstreamShapeError(f"the answer is a JSON {type(resp).__name__}, not an object")
    choices = resp.get("choices")
    if choices is not None and not isinstance(choices, list):
        raise UpstreamShapeError(f"'choices' is a {type(choices).__name__}, not a list")
    if choices and not isinstance(choices[0], dict):
        raise UpstreamShapeError(f"'choices[0]' is a {type(choices[0]).__name__}, not an object")
    if chat and choices and not isinstance(choices[0].get("message") or {}, dict):
        raise UpstreamShapeError("'choices[0].message' is not an object")
    try:
        cap = capture_response(resp, chat=chat)
    except _UNREADABLE as exc:
        raise UpstreamShapeError(f"unreadable capture fields ({type(exc).__name__}: {exc})") from None
    check_captured(cap)
    return cap


def check_captured(cap: Captured) -> None:
    """Raise UpstreamShapeError unless every captured field has the type a trace needs."""
    for name, ids in (("prompt_token_ids", cap.prompt_ids), ("token_ids", cap.completion_ids)):
        if ids is None:
            continue
        if not isinstance(ids, list):
            raise UpstreamShapeError(f"'{name}' is not a list of token ids")
        try:  # C-speed: traces pack token ids as int32, and this is the same conversion
            array("i").fromlist(ids)
        except (TypeError, OverflowError):
            raise UpstreamShapeError(f"'{name}' is not a list of int32 token ids") from None
    if cap.completion_logprobs is not None and not isinstance(cap.completion_logprobs, list):
        raise UpstreamShapeError("'logprobs' is not a list")
    for name, value in (("content", cap.text), ("reasoning", cap.reasoning), ("model", cap.model)):
        if not isinstance(value, str):
            raise UpstreamShapeError(f"'{name}' is a {type(value).__name__}, not a string")
    if cap.finish_reason is not None and not isinstance(cap.finish_reason, str):
        raise UpstreamShapeError("'finish_reason' is not a string")
    if not isinstance(cap.tool_calls, list):
        raise UpstreamShapeError("'tool_calls' is not a list")
    for i, call in enumerate(cap.tool_calls):
        _check_tool_call(i, call)
    u = cap.usage
    if u is not None:
        if not isinstance(u, dict):
            raise UpstreamShapeError("'usage' is not an object")
        for k in ("prompt_tokens", "completion_tokens", "total_tokens"):
            v = u.get(k)
            if v is not None and (type(v) is not int or not 0 <= v < 2**63):
                raise UpstreamShapeError(f"'usage.{k}' is not a token count")


def _check_tool_call(i: int, call: Any) -> None:
    """A tool call is read by key downstream (echo matching, traces, replies): its shape is checked
    here so a malformed one is the upstream's named error, never a KeyError in the gateway."""
    if not isinstance(call, dict):
        raise UpstreamShapeError(f"'tool_calls[{i}]' is a {type(call).__name__}, not an object")
    if not isinstance(call.get("id"), str):
        raise UpstreamShapeError(f"'tool_calls[{i}].id' is not a string")
    fn = call.get("function")
    if not isinstance(fn, dict):
        raise UpstreamShapeError(f"'tool_calls[{i}].function' is not an object")
    for key in ("name", "arguments"):
        if not isinstance(fn.get(key), str):
            raise UpstreamShapeError(f"'tool_calls[{i}].function.{key}' is not a string")


def strip_injected(resp: dict[str, Any], wants: ClientWants) -> bool:
    """Remove what the gateway asked for on the client's behalf. Returns True if anything changed."""
    changed = False
    if not wants.token_ids:
        if resp.pop("prompt_token_ids", None) is not None:
            changed = True
        for choice in resp.get("choices") or ():
            if choice.pop("token_ids", None) is not None:
                changed = True
            if choice.pop("prompt_token_ids", None) is not None:
                changed = True
    if not wants.logprobs:
        for choice in resp.get("choices") or ():
            if choice.get("logprobs") is not None:
                choice["logprobs"] = None
                changed = True
    return changed


class StreamCapture:
    """Accumulates capture fields from streamed chunks, in arrival order."""

    __slots__ = ("_tool_calls", "cap", "chat", "saw_done")

    def __init__(self, *, chat: bool) -> None:
        self.cap = Captured(completion_ids=[], completion_logprobs=[])
        self.chat = chat
        self._tool_calls: dict[int, dict[str, Any]] = {}
        self.saw_done = False

    def feed(self, chunk: dict[str, Any]) -> None:
        """Add one chunk; raises UpstreamShapeError if its capture fields cannot be read."""
        try:
            self._feed(chunk)
        except _UNREADABLE as exc:
            raise UpstreamShapeError(f"unreadable stream chunk ({type(exc).__name__}: {exc})") from None

    def _feed(self, chunk: dict[str, Any]) -> None:
        cap = self.cap
        if not cap.model and chunk.get("model"):
            cap.model = chunk["model"]
        if cap.prompt_ids is None and chunk.get("prompt_token_ids") is not None:
            cap.prompt_ids = chunk["prompt_token_ids"]
        if chunk.get("usage"):
            cap.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            if cap.prompt_ids is None and choice.get("prompt_token_ids") is not None:
                cap.prompt_ids = choice["prompt_token_ids"]
            ids = choice.get("token_ids")
            if ids:
                if not isinstance(ids, list):
                    raise UsageError("'token_ids' is not a list")
                cap.completion_ids.extend(ids)  # type: ignore[union-attr]
            lps = _logprobs_of(choice.get("logprobs"))
            if lps:
                cap.completion_logprobs.extend(lps)  # type: ignore[union-attr]
            if choice.get("finish_reason"):
                cap.finish_reason = choice["finish_reason"]
            if self.chat:
                delta = choice.get("delta") or {}
                if delta.get("content"):
                    cap.text += delta["content"]
                reasoning = delta.get("reasoning_content") or delta.get("reasoning")
                if reasoning:
                    cap.reasoning += reasoning
                for tc in delta.get("tool_calls") or ():
                    self._merge_tool_call(tc)
            elif choice.get("text"):
                cap.text += choice["text"]

    def _merge_tool_call(self, tc: dict[str, Any]) -> None:
        idx = tc.get("index", len(self._tool_calls))
        if type(idx) is not int:  # the calls are ordered by it: None or "0" would not sort
            raise UpstreamShapeError("a tool call delta's 'index' is not an integer")
        cur = self._tool_calls.get(idx)
        fn = tc.get("function") or {}
        if cur is None:
            cur = self._tool_calls[idx] = {
                "id": tc.get("id") or f"call_{idx}",
                "type": "function",
                "function": {"name": fn.get("name") or "", "arguments": fn.get("arguments") or ""},
            }
            return
        if tc.get("id"):
            cur["id"] = tc["id"]
        if fn.get("name"):
            cur["function"]["name"] += fn["name"]
        if fn.get("arguments"):
            cur["function"]["arguments"] += fn["arguments"]

    def result(self) -> Captured:
        self.cap.tool_calls = [self._tool_calls[k] for k in sorted(self._tool_calls)]
        return self.cap

    def checked_result(self) -> Captured:
        """``result()``, or UpstreamShapeError if what was assembled cannot go into a trace."""
        cap = self.result()
        check_captured(cap)
        return cap
