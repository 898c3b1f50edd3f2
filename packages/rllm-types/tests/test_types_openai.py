"""rllm.types.openai: every body it builds parses with the real openai client's own types, and
vLLM's token-id fields come through as the extra fields the gateway reads."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from openai.types import Completion as OpenAICompletion
from openai.types.chat import ChatCompletion as OpenAIChatCompletion
from openai.types.chat import ChatCompletionChunk as OpenAIChatCompletionChunk
from openai.types.shared import ErrorObject

from rllm.types import openai as oa

token_ids = st.lists(st.integers(min_value=0, max_value=2**31 - 1), max_size=12)
logprob = st.floats(max_value=0.0, allow_nan=False, allow_infinity=False)
texts = st.text(max_size=40)
finish = st.sampled_from(["stop", "length", "tool_calls"])
tool_call = st.builds(
    lambda i, name, args: {
        "id": f"call_{i}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)},
    },
    st.integers(0, 99),
    st.text(alphabet="abcdefghij_", min_size=1, max_size=8),
    st.dictionaries(st.text(alphabet="xyz", min_size=1, max_size=3), st.integers(), max_size=3),
)


@st.composite
def sampled(draw: st.DrawFn) -> tuple[list[str], list[float], list[list[tuple[str, float]]]]:
    """Token texts, their logprobs and top alternatives, all of one length."""
    n = draw(st.integers(0, 8))
    tokens = draw(st.lists(texts, min_size=n, max_size=n))
    lps = draw(st.lists(logprob, min_size=n, max_size=n))
    tops = draw(st.lists(st.lists(st.tuples(texts, logprob), max_size=3), min_size=n, max_size=n))
    return tokens, lps, tops


def _json(obj: object) -> bytes:
    return msgspec.json.encode(obj)


@given(
    content=st.none() | texts,
    calls=st.lists(tool_call, max_size=2),
    reason=finish,
    prompt=token_ids,
    ids=token_ids,
    tokens=sampled(),
    with_ids=st.booleans(),
    weight_version=st.none() | st.integers(0, 10**6),
)
def test_chat_completions_parse_with_the_openai_types(
    content, calls, reason, prompt, ids, tokens, with_ids, weight_version
) -> None:
    texts_, lps, tops = tokens
    choice = oa.ChatChoice(
        index=0,
        message=oa.AssistantMessage(content=content, refusal=None, tool_calls=calls),
        finish_reason=reason,
        logprobs=oa.ChatLogprobs(
            content=[oa.token_logprob(t, lp, top) for t, lp, top in zip(texts_, lps, tops, strict=True)]
        ),
    )
    body = oa.ChatCompletion(
        id=oa.response_id("chatcmpl"), model="m", choices=[choice], usage=oa.usage(len(prompt), len(ids))
    )
    if with_ids:
        body.prompt_token_ids, choice.token_ids = prompt, ids
    if weight_version is not None:
        body.weight_version = weight_version

    parsed = OpenAIChatCompletion.model_validate_json(_json(body))

    got = parsed.choices[0]
    assert got.message.content == content and got.finish_reason == reason
    assert [c.model_dump() for c in got.message.tool_calls or []] == calls
    assert [(e.token, e.logprob, bytes(e.bytes or [])) for e in got.logprobs.content] == [
        (t, lp, t.encode()) for t, lp in zip(texts_, lps, strict=True)
    ]
    assert [[(a.token, a.logprob) for a in e.top_logprobs] for e in got.logprobs.content] == tops
    assert parsed.usage.total_tokens == len(prompt) + len(ids)
    extra, choice_extra = parsed.model_extra or {}, got.model_extra or {}
    assert extra.get("prompt_token_ids") == (prompt if with_ids else None)
    assert choice_extra.get("token_ids") == (ids if with_ids else None)
    assert extra.get("weight_version") == weight_version


@given(
    text=texts, prompt=token_ids, ids=token_ids, tokens=sampled(), top=st.booleans(), with_ids=st.booleans()
)
def test_completions_parse_and_offsets_index_the_text(text, prompt, ids, tokens, top, with_ids) -> None:
    texts_, lps, _ = tokens
    tops = [{t: lp} for t, lp in zip(texts_, lps, strict=True)] if top else None
    choice = oa.CompletionChoice(
        index=0, text=text, finish_reason="length", logprobs=oa.completion_logprobs(texts_, lps, tops)
    )
    body = oa.Completion(id=oa.response_id("cmpl"), model="m", choices=[choice], usage=oa.usage(1, 2))
    if with_ids:
        body.prompt_token_ids = choice.prompt_token_ids = prompt
        choice.token_ids = ids

    parsed = OpenAICompletion.model_validate_json(_json(body))

    got = parsed.choices[0]
    assert got.text == text and got.logprobs.tokens == texts_ and got.logprobs.token_logprobs == lps
    joined = "".join(texts_)
    for offset, t in zip(got.logprobs.text_offset, texts_, strict=True):
        assert joined[offset : offset + len(t)] == t
    assert (got.model_extra or {}).get("token_ids") == (ids if with_ids else None)
    assert (parsed.model_extra or {}).get("prompt_token_ids") == (prompt if with_ids else None)


@given(piece=texts, tid=st.integers(0, 2**31 - 1), role=st.booleans(), last=st.none() | finish)
def test_stream_chunks_parse_with_the_openai_types(piece, tid, role, last) -> None:
    delta = oa.ChatDelta(role="assistant", content=piece) if role else oa.ChatDelta(content=piece)
    chunk = oa.ChatCompletionChunk(
        id="chatcmpl-1",
        model="m",
        choices=[oa.ChatChunkChoice(delta=delta, finish_reason=last, token_ids=[tid])],
    )
    parsed = OpenAIChatCompletionChunk.model_validate_json(_json(chunk))
    assert parsed.choices[0].delta.content == piece and parsed.choices[0].finish_reason == last
    assert parsed.choices[0].delta.role == ("assistant" if role else None)
    assert (parsed.choices[0].model_extra or {}).get("token_ids") == [tid]

    usage_only = oa.ChatCompletionChunk(id="chatcmpl-1", model="m", choices=[], usage=oa.usage(3, 4))
    assert OpenAIChatCompletionChunk.model_validate_json(_json(usage_only)).usage.total_tokens == 7


def test_unset_extensions_are_left_out_of_the_json() -> None:
    choice = oa.ChatChoice(index=0, message=oa.AssistantMessage(content="hi"), finish_reason="stop")
    body = json.loads(_json(oa.ChatCompletion(id="x", model="m", choices=[choice], usage=oa.usage(1, 1))))
    assert "prompt_token_ids" not in body and "weight_version" not in body
    assert "token_ids" not in body["choices"][0]
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "hi"}


def test_pre_encoded_logprob_entries_are_spliced_verbatim() -> None:
    entry = _json(oa.token_logprob("a", -0.5))
    logprobs = oa.ChatLogprobs(content=msgspec.Raw(b"[" + entry + b"," + entry + b"]"))
    choice = oa.ChatChoice(
        index=0, message=oa.AssistantMessage(content="aa"), finish_reason="stop", logprobs=logprobs
    )
    parsed = OpenAIChatCompletion.model_validate_json(
        _json(oa.ChatCompletion(id="x", model="m", choices=[choice], usage=oa.usage(1, 2)))
    )
    assert [e.token for e in parsed.choices[0].logprobs.content] == ["a", "a"]


@given(
    status=st.integers(100, 599),
    message=texts,
    param=st.none() | texts,
    code=st.none() | st.text(min_size=1, max_size=20),
)
def test_error_bodies_parse_with_the_openai_error_type(status, message, param, code) -> None:
    raw = json.loads(_json(oa.error_body(status, message, param=param, code=code)))
    assert set(raw) == {"error"}
    err = ErrorObject.model_validate(raw["error"])
    assert err.message == message and err.param == param
    assert err.code == (code or str(status))
    assert err.type == oa.ERROR_TYPES.get(
        status, "server_error" if status >= 500 else "invalid_request_error"
    )


def test_error_types_follow_the_status_table() -> None:
    assert oa.error_type(401) == "authentication_error" and oa.error_type(429) == "rate_limit_error"
    assert oa.error_type(418) == "invalid_request_error" and oa.error_type(500) == "server_error"
    assert oa.error_type(502) == "upstream_error" and oa.error_type(504) == "timeout_error"


@pytest.mark.parametrize("status", [0, 99, 600, True, "404"])
def test_error_body_refuses_what_is_not_an_http_status(status) -> None:
    with pytest.raises(ValueError, match="status must be an HTTP status code"):
        oa.error_body(status, "x")


def test_completion_logprobs_name_the_lists_that_disagree() -> None:
    with pytest.raises(ValueError, match="2 tokens but 1 logprobs"):
        oa.completion_logprobs(["a", "b"], [-1.0])
    with pytest.raises(ValueError, match="and 1 top_logprobs"):
        oa.completion_logprobs(["a", "b"], [-1.0, -2.0], [{"a": -1.0}])


def test_response_ids_are_unique_and_shaped_like_uuid_hex() -> None:
    ids = {oa.response_id("chatcmpl") for _ in range(1000)}
    assert len(ids) == 1000
    for rid in ids:
        kind, _, digits = rid.partition("-")
        assert kind == "chatcmpl" and len(digits) == 32 and int(digits, 16) >= 0


def test_a_forked_child_draws_ids_apart_from_its_parent() -> None:
    """A forked flow worker would otherwise repeat its parent's next ids, prefix and counter."""
    import os

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, then exit without running pytest's teardown
        os.write(write, " ".join(oa.response_id("cmpl") for _ in range(3)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = set(pipe.read().split())
    os.waitpid(pid, 0)
    parent = {oa.response_id("cmpl") for _ in range(3)}
    assert len(child) == 3 and not child & parent
