"""The mock upstream as the real openai client sees it: vLLM's token-id fields, logprobs,
streams, tool calls, OpenAI error bodies and injected failures, over loopback HTTP."""

from __future__ import annotations

import json
import subprocess
import sys

import openai
import pytest

from rllm.testing import MockReply, MockUpstream, say_back
from rllm.testing.mock_tokens import logprob_of

IDS = {"return_token_ids": True}


@pytest.fixture
async def mock():
    async with MockUpstream(responder=lambda body: None) as m:
        yield m


def _client(mock: MockUpstream) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=mock.url, api_key="x", max_retries=0)


async def test_chat_reply_carries_token_ids_and_logprobs(mock) -> None:
    async with _client(mock) as client:
        reply = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], logprobs=True, extra_body=IDS
        )
    choice = reply.choices[0]
    assert choice.message.content == "echo: hi" and choice.finish_reason == "stop"
    ids = choice.model_extra["token_ids"]
    assert ids == list(b"echo: hi")  # without a tokenizer a text's ids are its bytes
    assert bytes(reply.model_extra["prompt_token_ids"]) == b"<user>hi\n<assistant>"
    assert [e.logprob for e in choice.logprobs.content] == [logprob_of(t) for t in ids]
    assert "".join(e.token for e in choice.logprobs.content) == "echo: hi"
    assert reply.usage.completion_tokens == len(ids) and reply.id.startswith("chatcmpl-")


async def test_completion_reply_and_max_tokens_cut(mock) -> None:
    async with _client(mock) as client:
        reply = await client.completions.create(
            model="m", prompt=[1, 2, 3], max_tokens=4, logprobs=0, extra_body=IDS
        )
    choice = reply.choices[0]
    assert choice.finish_reason == "length" and choice.model_extra["token_ids"] == list(b"echo")
    assert choice.model_extra["prompt_token_ids"] == [1, 2, 3] == reply.model_extra["prompt_token_ids"]
    assert choice.logprobs.text_offset == [0, 1, 2, 3] and choice.text == "echo"


async def test_a_stream_joins_to_the_whole_reply(mock) -> None:
    mock.responder = lambda body: MockReply(text="sunny", tool_calls=[("weather", {"city": "Oslo"})])
    async with _client(mock) as client:
        stream = await client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "weather?"}],
            stream=True,
            stream_options={"include_usage": True},
            extra_body=IDS,
        )
        chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    ids = [t for c in chunks if c.choices for t in (c.choices[0].model_extra or {}).get("token_ids", [])]
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert text == "sunny" and calls[0].function.name == "weather"
    assert json.loads(calls[0].function.arguments) == {"city": "Oslo"}
    assert bytes(ids).startswith(b"sunny<tool_call>weather:")
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].usage.completion_tokens == len(ids) and len({c.id for c in chunks}) == 1


async def test_errors_are_openai_error_bodies(mock) -> None:
    async with _client(mock) as client:
        with pytest.raises(openai.BadRequestError) as bad:
            await client.chat.completions.create(model="m", messages=[])
        assert bad.value.body == {
            "message": "messages must be a non-empty list",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "400",
        }
        mock.fail("status", status=429, count=1)
        with pytest.raises(openai.RateLimitError) as limited:
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        assert limited.value.body["type"] == "rate_limit_error"
        again = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        assert again.choices[0].message.content == "echo: x"
    assert mock.stats.by_path["/v1/chat/completions"] == 3


@pytest.mark.parametrize(
    ("kwargs", "field"), [({"mode": "explode"}, "mode must be one of"), ({"status": 42}, "status must be")]
)
def test_bad_failure_injection_is_refused(kwargs, field) -> None:
    with pytest.raises(ValueError, match=field):
        MockUpstream().fail(**kwargs)


def test_say_back_answers_the_word_except_where_told() -> None:
    respond = say_back(wrong_when=lambda messages, word: word == "lemon")
    assert respond({"messages": [{"role": "user", "content": "say: plum"}]}) == "plum"
    assert respond({"messages": [{"role": "user", "content": [{"type": "text", "text": "say: lemon"}]}]}) == (
        "wrong"
    )


def test_importing_the_package_loads_no_heavy_dependency() -> None:
    """Every nox session installs rllm-testing; its top level must import without torch,
    transformers, aiohttp or a service SDK."""
    heavy = ["torch", "transformers", "tokenizers", "aiohttp", "tinker", "fireworks", "e2b"]
    code = f"import sys, rllm.testing; print([m for m in {heavy!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
