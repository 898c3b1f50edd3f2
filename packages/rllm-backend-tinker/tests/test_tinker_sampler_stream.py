"""Streamed calls on the local sampler: the real `openai` client reads the same tokens, text and
logprobs as from a whole answer, and a cumulative-mode gateway captures a streaming agent's
calls with exact token ids."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import openai
import pytest

from rllm.backends.tinker import TinkerBackend
from rllm.gateway import GatewayClient, GatewayConfig, GatewayServer

MESSAGES = [{"role": "user", "content": "say: apple"}]
GREEDY = {"max_tokens": 6, "temperature": 0.0, "logprobs": True}


def _client(backend: TinkerBackend) -> openai.OpenAI:
    return openai.OpenAI(base_url=backend.inference_urls()[0], api_key="unused", max_retries=0)


def test_a_streamed_chat_answer_equals_the_whole_answer(sampler_backend: TinkerBackend) -> None:
    client, model = _client(sampler_backend), sampler_backend.served_model_name()
    extra = {"return_token_ids": True}
    whole = client.chat.completions.create(model=model, messages=MESSAGES, extra_body=extra, **GREEDY)
    chunks = [
        c.model_dump()
        for c in client.chat.completions.create(
            model=model,
            messages=MESSAGES,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=extra,
            **GREEDY,
        )
    ]
    body = whole.model_dump()
    choices = [ch for c in chunks for ch in c["choices"]]
    assert chunks[0]["prompt_token_ids"] == body["prompt_token_ids"]
    assert choices[0]["delta"]["role"] == "assistant"
    assert "".join(ch["delta"]["content"] or "" for ch in choices) == body["choices"][0]["message"]["content"]
    assert [t for ch in choices for t in ch.get("token_ids") or []] == body["choices"][0]["token_ids"]
    streamed_lp = [e["logprob"] for ch in choices if ch["logprobs"] for e in ch["logprobs"]["content"]]
    whole_lp = [e["logprob"] for e in body["choices"][0]["logprobs"]["content"]]
    assert streamed_lp == pytest.approx(whole_lp, abs=1e-4)
    assert [ch["finish_reason"] for ch in choices if ch["finish_reason"]] == [
        body["choices"][0]["finish_reason"]
    ]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == body["usage"]


def test_a_streamed_completion_carries_every_choice(sampler_backend: TinkerBackend) -> None:
    stream = _client(sampler_backend).completions.create(
        model="any",
        prompt="<|user|> say : plum <|end|> <|assistant|>",
        max_tokens=4,
        n=2,
        logprobs=0,
        stream=True,
        extra_body={"return_token_ids": True},
    )
    by_index: dict[int, list[int]] = {0: [], 1: []}
    lengths: dict[int, int] = {0: 0, 1: 0}
    for chunk in stream:
        for ch in chunk.model_dump()["choices"]:
            by_index[ch["index"]] += ch.get("token_ids") or []
            lengths[ch["index"]] += len((ch["logprobs"] or {}).get("token_logprobs") or [])
    assert all(1 <= len(ids) <= 4 for ids in by_index.values())
    assert lengths == {i: len(ids) for i, ids in by_index.items()}


def test_bad_stream_fields_are_a_400_naming_them(sampler_backend: TinkerBackend) -> None:
    url = sampler_backend.inference_urls()[0] + "/chat/completions"
    for extra, param in (
        ({"stream": "yes"}, "stream"),
        ({"stream": True, "stream_options": {"include_usage": "sure"}}, "stream_options"),
    ):
        body = json.dumps({"model": "m", "messages": MESSAGES, **extra}).encode()
        request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(request, timeout=30)
        assert err.value.code == 400
        assert json.loads(err.value.read())["error"]["param"] == param


async def test_a_streaming_agent_is_captured_token_for_token_through_the_gateway(
    sampler_backend: TinkerBackend,
) -> None:
    model = sampler_backend.served_model_name()
    whole = _client(sampler_backend).chat.completions.create(
        model=model, messages=MESSAGES, extra_body={"return_token_ids": True}, **GREEDY
    )
    body = whole.model_dump()
    cfg = GatewayConfig(
        upstreams=sampler_backend.inference_urls(),
        tokenizer_path=sampler_backend.tokenizer_path(),
        tokenizer_mode="cumulative",
        health_interval_s=0,
    )
    async with GatewayServer(cfg) as gw, GatewayClient(gw.url) as admin:
        async with openai.AsyncOpenAI(base_url=admin.session_url("s"), api_key="x", max_retries=0) as client:
            stream = await client.chat.completions.create(
                model=model, messages=MESSAGES, stream=True, **GREEDY
            )
            text = "".join([c.delta.content or "" async for chunk in stream for c in chunk.choices])
        (trace,) = await admin.get_traces("s")
    # the gateway rendered the chat itself and streamed from /v1/completions: same tokens
    assert trace.status == "ok" and text == body["choices"][0]["message"]["content"]
    assert list(trace.prompt_ids or []) == body["prompt_token_ids"]
    assert list(trace.completion_ids or []) == body["choices"][0]["token_ids"]
    whole_lp = [e["logprob"] for e in body["choices"][0]["logprobs"]["content"]]
    assert list(trace.completion_logprobs or []) == pytest.approx(whole_lp, abs=1e-4)
