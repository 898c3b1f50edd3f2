"""OpenAI-compatible request parsing and response building (with vLLM's token-id fields).

Parsing turns a JSON body into a GenerationRequest or raises RequestError naming the bad field.
Responses are built with :mod:`rllm.types.openai`: the OpenAI schema plus vLLM's extensions
(with ``return_token_ids`` the body carries top-level ``prompt_token_ids`` and
``choices[i].token_ids``); every response carries ``weight_version`` (the sampler weights that
produced it).
"""

from __future__ import annotations

from typing import Any

import msgspec

from rllm.backends.tinker.local.generation import GeneratedSequence, GenerationRequest
from rllm.gateway.tool_parser import ToolCallParser
from rllm.types import openai
from rllm.types.errors import RLLMError

MAX_N = 128
MAX_TOP_LOGPROBS = 20


class RequestError(RLLMError, ValueError):
    """A client error (HTTP 400) naming the offending parameter."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param

    def body(self) -> dict[str, Any]:
        """The OpenAI error body of this 400 answer."""
        return msgspec.to_builtins(openai.error_body(400, str(self), param=self.param))


def _get(body: dict[str, Any], name: str, kinds: type | tuple[type, ...], default: Any) -> Any:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
        raise RequestError(f"'{name}' must be {_kind_names(kinds)}, got a boolean", name)
    if not isinstance(value, kinds):
        raise RequestError(f"'{name}' must be {_kind_names(kinds)}, got {type(value).__name__}", name)
    return value


def _kind_names(kinds: type | tuple[type, ...]) -> str:
    names = [k.__name__ for k in (kinds if isinstance(kinds, tuple) else (kinds,))]
    return " or ".join(
        {"int": "an integer", "float": "a number", "str": "a string", "bool": "a boolean"}.get(n, n)
        for n in names
    )


def parse_sampling(
    body: dict[str, Any], prompt_ids: list[int], default_max_tokens: int, max_positions: int
) -> GenerationRequest:
    """The sampling fields shared by chat and completions."""
    if not isinstance(body.get("stream", False), bool):
        raise RequestError("'stream' must be a boolean", "stream")
    max_tokens = _get(body, "max_completion_tokens", int, None)
    if max_tokens is None:
        max_tokens = _get(body, "max_tokens", int, default_max_tokens)
    if max_tokens < 1:
        raise RequestError(f"'max_tokens' must be >= 1, got {max_tokens}", "max_tokens")
    room = max_positions - len(prompt_ids)
    if room < 1:
        raise RequestError(
            f"prompt has {len(prompt_ids)} tokens; the model's context is {max_positions} tokens", "messages"
        )
    temperature = float(_get(body, "temperature", (int, float), 1.0))
    if not 0.0 <= temperature <= 100.0:
        raise RequestError(f"'temperature' must be in [0, 100], got {temperature}", "temperature")
    top_p = float(_get(body, "top_p", (int, float), 1.0))
    if not 0.0 < top_p <= 1.0:
        raise RequestError(f"'top_p' must be in (0, 1], got {top_p}", "top_p")
    n = _get(body, "n", int, 1)
    if not 1 <= n <= MAX_N:
        raise RequestError(f"'n' must be in [1, {MAX_N}], got {n}", "n")
    seed = _get(body, "seed", int, None)
    stop = body.get("stop")
    if stop is None:
        stops: list[str] = []
    elif isinstance(stop, str):
        stops = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = list(stop)
    else:
        raise RequestError("'stop' must be a string or a list of strings", "stop")
    stop_token_ids = _get(body, "stop_token_ids", list, [])
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in stop_token_ids):
        raise RequestError("'stop_token_ids' must be a list of integers", "stop_token_ids")
    return GenerationRequest(
        prompt_ids=prompt_ids,
        max_tokens=min(max_tokens, room),
        temperature=temperature,
        top_p=top_p,
        n=n,
        seed=seed,
        stop=stops,
        stop_token_ids=stop_token_ids,
        ignore_eos=bool(_get(body, "ignore_eos", bool, False)),
    )


def message_text(content: Any, where: str) -> str:
    """Plain text of an OpenAI message content (a string or a list of text blocks)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, block in enumerate(content):
            if (
                not isinstance(block, dict)
                or block.get("type") != "text"
                or not isinstance(block.get("text"), str)
            ):
                raise RequestError(
                    f"{where}.content[{j}] must be a text block (this sampler is text-only)", where
                )
            parts.append(block["text"])
        return "".join(parts)
    raise RequestError(f"{where}.content must be a string or a list of text blocks", where)


def parse_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RequestError(f"messages[{i}] must be an object with a string 'role'", "messages")
        out.append({**m, "content": message_text(m.get("content"), f"messages[{i}]")})
    return out


def parse_prompts(body: dict[str, Any], encode: Any) -> list[list[int]]:
    """Completions prompts: a string, a list of token ids, or a list of either."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return [encode(prompt)]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return [list(prompt)]
        if all(isinstance(p, str) for p in prompt):
            return [encode(p) for p in prompt]
        if all(isinstance(p, list) and p and all(isinstance(t, int) for t in p) for p in prompt):
            return [list(p) for p in prompt]
    raise RequestError("'prompt' must be a string, a list of token ids, or a list of either", "prompt")


def _usage(prompt_tokens: int, seqs: list[GeneratedSequence]) -> openai.CompletionUsage:
    return openai.usage(prompt_tokens, sum(len(s.completion_ids) for s in seqs))


def chat_response(
    model: str,
    prompt_ids: list[int],
    seqs: list[GeneratedSequence],
    decode_token: Any,
    *,
    logprobs: bool,
    return_token_ids: bool,
    tool_calls: ToolCallParser | None = None,
) -> dict[str, Any]:
    """The chat.completion body of ``seqs`` (one choice each), as JSON-ready builtins. With
    ``tool_calls`` (a request with tools) each reply is split into content and tool calls."""
    choices = []
    for i, s in enumerate(seqs):
        message, finish = openai.AssistantMessage(content=s.text), s.finish_reason
        if tool_calls is not None:
            parsed = tool_calls.parse(s.text, s.completion_ids)
            message.content = parsed.content
            if parsed.tool_calls:
                message.tool_calls = parsed.tool_calls
                finish = "tool_calls" if finish == "stop" else finish  # as vLLM: a call, not a stop
        choice = openai.ChatChoice(index=i, message=message, finish_reason=finish)
        if logprobs:
            content = [
                openai.token_logprob(decode_token(tok), lp, [(decode_token(t), v) for t, v in top])
                for tok, lp, top in zip(s.completion_ids, s.completion_logprobs, s.top_logprobs, strict=True)
            ]
            choice.logprobs = openai.ChatLogprobs(content=content)
        if return_token_ids:
            choice.token_ids = s.completion_ids
        choices.append(choice)
    body = openai.ChatCompletion(
        id=openai.response_id("chatcmpl"),
        model=model,
        choices=choices,
        usage=_usage(len(prompt_ids), seqs),
        weight_version=seqs[0].weight_version if seqs else 0,
    )
    if return_token_ids:
        body.prompt_token_ids = prompt_ids
    return msgspec.to_builtins(body)


def completion_response(
    model: str,
    prompts: list[list[int]],
    results: list[list[GeneratedSequence]],
    decode_token: Any,
    *,
    logprobs: int | None,
    return_token_ids: bool,
) -> dict[str, Any]:
    """The text_completion body: the choices of every prompt in order, as JSON-ready builtins."""
    choices = []
    for prompt_ids, seqs in zip(prompts, results, strict=True):
        for s in seqs:
            choice = openai.CompletionChoice(index=len(choices), text=s.text, finish_reason=s.finish_reason)
            if logprobs is not None:
                top = (
                    [{decode_token(t): v for t, v in top} for top in s.top_logprobs] if logprobs > 0 else None
                )
                choice.logprobs = openai.completion_logprobs(
                    [decode_token(t) for t in s.completion_ids], s.completion_logprobs, top
                )
            if return_token_ids:
                choice.prompt_token_ids = prompt_ids
                choice.token_ids = s.completion_ids
            choices.append(choice)
    all_seqs = [s for seqs in results for s in seqs]
    body = openai.Completion(
        id=openai.response_id("cmpl"),
        model=model,
        choices=choices,
        usage=_usage(sum(len(p) for p in prompts), all_seqs),
        weight_version=all_seqs[0].weight_version if all_seqs else 0,
    )
    if return_token_ids and len(prompts) == 1:
        body.prompt_token_ids = prompts[0]
    return msgspec.to_builtins(body)
