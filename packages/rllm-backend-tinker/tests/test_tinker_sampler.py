"""The local sampler server, exercised with the real `openai` client over loopback HTTP."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

import openai
import pytest
import torch
from tinker_helpers import teacher_forced_logprobs

from rllm.backends.tinker import TinkerBackend


def _client(backend: TinkerBackend) -> openai.OpenAI:
    return openai.OpenAI(base_url=backend.inference_urls()[0], api_key="unused", max_retries=0)


def _teacher_forced(backend: TinkerBackend, tokens: list[int], temperature: float = 1.0) -> torch.Tensor:
    """log p(tokens[i] | tokens[:i]) for i >= 1 under the sampler's model, by one full forward pass."""
    return teacher_forced_logprobs(backend.service.engine.model, tokens, temperature)


def _post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_chat_token_ids_and_logprobs_match_a_teacher_forced_pass(sampler_backend: TinkerBackend) -> None:
    response = _client(sampler_backend).chat.completions.create(
        model=sampler_backend.served_model_name(),
        messages=[{"role": "user", "content": "say: apple"}],
        max_tokens=6,
        n=3,
        logprobs=True,
        extra_body={"return_token_ids": True},
    )
    body = response.model_dump()
    prompt = body["prompt_token_ids"]
    tokenizer = sampler_backend.service.tokenizer
    expected_prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "say: apple"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt == tokenizer(expected_prompt, add_special_tokens=False)["input_ids"]
    assert len(body["choices"]) == 3
    for choice in body["choices"]:
        ids = choice["token_ids"]
        assert 1 <= len(ids) <= 6
        content = choice["logprobs"]["content"]
        assert [c["token"] for c in content] == [tokenizer.decode([i]) for i in ids]
        assert all(c["bytes"] == list(c["token"].encode()) and c["top_logprobs"] == [] for c in content)
        forced = _teacher_forced(sampler_backend, prompt + ids)[len(prompt) - 1 :]
        sampled = torch.tensor([c["logprob"] for c in content])
        assert torch.allclose(sampled, forced, atol=1e-4), (sampled, forced)
        assert choice["message"]["content"] == tokenizer.decode(ids, skip_special_tokens=True)
        assert choice["finish_reason"] == ("stop" if ids[-1] == tokenizer.eos_token_id else "length")
    assert body["usage"]["prompt_tokens"] == len(prompt)
    assert body["weight_version"] == 0


def test_logprobs_are_those_of_the_tempered_distribution(sampler_backend: TinkerBackend) -> None:
    body = (
        _client(sampler_backend)
        .completions.create(
            model="any",
            prompt="<|user|> say : plum <|end|> <|assistant|>",
            max_tokens=5,
            temperature=0.5,
            logprobs=2,
            extra_body={"return_token_ids": True, "ignore_eos": True},
        )
        .model_dump()
    )
    prompt, ids = body["prompt_token_ids"], body["choices"][0]["token_ids"]
    assert len(ids) == 5 and body["choices"][0]["finish_reason"] == "length"
    forced = _teacher_forced(sampler_backend, prompt + ids, temperature=0.5)[len(prompt) - 1 :]
    logprobs = body["choices"][0]["logprobs"]
    assert torch.allclose(torch.tensor(logprobs["token_logprobs"]), forced, atol=1e-4)
    assert len(logprobs["tokens"]) == 5 and len(logprobs["text_offset"]) == 5
    assert all(1 <= len(top) <= 2 for top in logprobs["top_logprobs"])
    # the top alternatives are the most likely tokens: none is less likely than the sampled one
    for top, lp in zip(logprobs["top_logprobs"], logprobs["token_logprobs"], strict=True):
        assert max(top.values()) >= lp - 1e-5


def test_completions_accept_token_ids_and_seed_is_reproducible(sampler_backend: TinkerBackend) -> None:
    client = _client(sampler_backend)
    prompt = sampler_backend.service.tokenizer("<|user|> say : mango <|end|> <|assistant|>")["input_ids"]

    def sample(seed: int) -> list[list[int]]:
        body = client.completions.create(
            model="m", prompt=prompt, max_tokens=8, n=2, seed=seed, extra_body={"return_token_ids": True}
        ).model_dump()
        assert body["prompt_token_ids"] == prompt
        return [c["token_ids"] for c in body["choices"]]

    first = sample(7)
    assert sample(7) == first
    assert first[0] != first[1] or sample(8) != first  # the n choices and other seeds differ


def test_greedy_stop_strings_and_max_tokens(sampler_backend: TinkerBackend) -> None:
    client = _client(sampler_backend)
    kwargs = {"model": "m", "messages": [{"role": "user", "content": "say: pear"}], "temperature": 0.0}
    a = client.chat.completions.create(max_tokens=10, extra_body={"ignore_eos": True}, **kwargs)
    b = client.chat.completions.create(max_tokens=10, extra_body={"ignore_eos": True}, **kwargs)
    assert a.choices[0].message.content == b.choices[0].message.content  # greedy is deterministic
    seeded = {**kwargs, "temperature": 1.0, "seed": 11, "extra_body": {"ignore_eos": True}}
    text = client.chat.completions.create(max_tokens=10, **seeded).choices[0].message.content
    words = [w for w in text.split(" ") if w]
    assert len(words) >= 3, text
    stop_word = words[len(words) // 2]
    c = client.chat.completions.create(max_tokens=10, stop=[stop_word], **seeded)
    assert c.choices[0].finish_reason == "stop"
    assert c.choices[0].message.content == text[: text.find(stop_word)]  # cut before the stop string
    d = client.chat.completions.create(max_tokens=1, **kwargs)
    assert d.usage.completion_tokens == 1


async def test_concurrent_requests_are_batched(sampler_backend: TinkerBackend) -> None:
    engine = sampler_backend.service.engine
    client = openai.AsyncOpenAI(base_url=sampler_backend.inference_urls()[0], api_key="x", max_retries=0)
    before = engine.batches_run
    responses = await asyncio.gather(
        *(
            client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": f"say: {w}"}], max_tokens=4, n=2
            )
            for w in ["apple", "banana", "cherry", "grape", "lemon", "mango", "peach", "plum"] * 3
        )
    )
    assert all(len(r.choices) == 2 for r in responses)
    assert engine.batches_run - before < len(responses)  # several requests shared a batch
    assert engine.max_batch_seen > 2
    await client.close()


def test_models_health_and_bad_requests(sampler_backend: TinkerBackend) -> None:
    base = sampler_backend.inference_urls()[0]
    models = _client(sampler_backend).models.list()
    assert [m.id for m in models.data] == [sampler_backend.served_model_name()]
    with urllib.request.urlopen(base.removesuffix("/v1") + "/health", timeout=10) as response:
        assert json.loads(response.read())["status"] == "ok"
    cases = [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, "temperature"),
        ({"messages": [{"role": "user", "content": "hi"}], "top_p": 0}, "top_p"),
        ({"messages": [{"role": "user", "content": "hi"}], "n": 0}, "n"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0]"),
    ]
    for body, param in cases:
        status, error = _post(base + "/chat/completions", {"model": "m", **body})
        assert status == 400, body
        assert error["error"]["param"] == param, error
    status, error = _post(base + "/completions", {"model": "m", "prompt": [1.5, 2]})
    assert status == 400 and error["error"]["param"] == "prompt"
    # a text-only model refuses images sent with token ids rather than answering without them
    images = {"image": ["data:image/png;base64,iVBORw0KGgo="]}
    status, error = _post(base + "/completions", {"model": "m", "prompt": [1, 2], "multi_modal_data": images})
    assert status == 400 and error["error"]["param"] == "multi_modal_data"


def test_multi_turn_prompt_extends_the_previous_turn_token_for_token(sampler_backend: TinkerBackend) -> None:
    client = _client(sampler_backend)
    tokenizer = sampler_backend.service.tokenizer
    eos = tokenizer.eos_token_id
    history = [{"role": "user", "content": "say: apple"}]
    # The claim holds for replies whose text re-tokenizes to the sampled ids (a random model may
    # sample a special token that the text drops: that is what the gateway's cumulative mode is
    # for). Which reply a seed gives depends on the device's RNG, so try seeds until one is.
    for seed in range(20):
        first = client.chat.completions.create(
            model="m", messages=history, max_tokens=3, seed=seed, extra_body={"return_token_ids": True}
        ).model_dump()
        reply_ids = first["choices"][0]["token_ids"]
        content = first["choices"][0]["message"]["content"] or ""
        if tokenizer.encode(content, add_special_tokens=False) == [t for t in reply_ids if t != eos]:
            break
    else:
        pytest.fail("20 seeds gave no reply that re-tokenizes to its own ids")
    history += [{"role": "assistant", "content": content}]
    history += [{"role": "user", "content": "again"}]
    second = client.chat.completions.create(
        model="m", messages=history, max_tokens=3, extra_body={"return_token_ids": True}
    ).model_dump()
    closed = reply_ids if reply_ids[-1] == eos else [*reply_ids, eos]
    # word-level tokens: the re-rendered history starts with turn 1's prompt + reply tokens
    prefix = first["prompt_token_ids"] + closed
    assert second["prompt_token_ids"][: len(prefix)] == prefix
