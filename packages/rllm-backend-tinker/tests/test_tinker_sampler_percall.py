"""The local sampler's per-call work (#35): a repeated chat prompt is rendered and tokenized once,
keyed exactly; a decode step's answers reach a caller's event loop in one wake-up; the calls a
loop submits in one iteration start one batch together.

Real parts: the tiny model (with its tool-calling chat template), its SamplerEngine and
SamplerServer (called in process, as an embedded gateway does), real event loops and threads.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tinker_helpers import WORDS, running_sampler_engine

from rllm.backends.tinker.local.generation import GenerationRequest, SamplerEngine
from rllm.backends.tinker.local.model import load_pretrained, load_tokenizer
from rllm.backends.tinker.local.prompt_cache import PromptCache, prompt_key
from rllm.backends.tinker.local.protocol import parse_messages
from rllm.backends.tinker.local.server import SamplerServer
from rllm.tiny import init_tiny_model


@pytest.fixture(scope="module")
def tool_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model whose chat template renders tools (so a tool list changes the prompt)."""
    return init_tiny_model(
        tmp_path_factory.mktemp("tiny-tools") / "model", vocab_words=WORDS, tool_calls=True
    )


@pytest.fixture
def engine(tool_model_path: Path) -> Iterator[SamplerEngine]:
    with running_sampler_engine(tool_model_path) as started:
        yield started


@pytest.fixture
def server(engine: SamplerEngine) -> SamplerServer:
    return SamplerServer(engine, "tiny")  # not started: calls come in process (post_whole)


class _CountingTemplate:
    """Counts the chat renders of a tokenizer (its own apply_chat_template does the work)."""

    def __init__(self, tokenizer: Any) -> None:
        self.inner = tokenizer.apply_chat_template
        self.calls = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.inner(*args, **kwargs)


def _chat(server: SamplerServer, body: dict[str, Any]) -> dict[str, Any]:
    body = {"max_tokens": 1, "temperature": 0.0, "return_token_ids": True, **body}
    status, raw = asyncio.run(server.post_whole("/chat/completions", body))
    assert status == 200, raw
    return json.loads(raw)


def _fresh_ids(tokenizer: Any, render: Any, body: dict[str, Any]) -> list[int]:
    """What the sampler would render for ``body`` with no cache at all (``render``: the
    tokenizer's own apply_chat_template)."""
    kwargs = dict(body.get("chat_template_kwargs") or {})
    if body.get("tools"):
        kwargs["tools"] = body["tools"]
    text = render(
        parse_messages(body),
        tokenize=False,
        add_generation_prompt=body.get("add_generation_prompt", True),
        **kwargs,
    )
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


_TOOL = {"type": "function", "function": {"name": "banana", "parameters": {"type": "object"}}}


def test_a_repeated_chat_prompt_is_rendered_once_and_each_variant_gets_its_own(
    server: SamplerServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokenizer = server.engine.tokenizer
    counting = _CountingTemplate(tokenizer)
    monkeypatch.setattr(tokenizer, "apply_chat_template", counting)
    base: dict[str, Any] = {"messages": [{"role": "user", "content": "say: apple"}]}
    first = _chat(server, base)
    for _ in range(7):  # the rest of a GRPO group of 8
        assert _chat(server, base)["prompt_token_ids"] == first["prompt_token_ids"]
    assert counting.calls == 1

    variants: list[dict[str, Any]] = [
        {"messages": [{"role": "user", "content": "say: lemon"}]},  # another message
        {"messages": [{"role": "system", "content": "say: apple"}]},  # another role
        {**base, "tools": [_TOOL]},  # a tool list
        {**base, "tools": [{**_TOOL, "function": {**_TOOL["function"], "name": "cherry"}}]},  # another
        {**base, "add_generation_prompt": False},  # a template option
        {**base, "chat_template_kwargs": {"tools": [{"type": "function", "function": {"name": "grape"}}]}},
    ]
    seen = {tuple(first["prompt_token_ids"])}
    for body in variants:
        ids = _chat(server, body)["prompt_token_ids"]
        assert ids == _fresh_ids(tokenizer, counting.inner, body)
        seen.add(tuple(ids))
    assert len(seen) == len(variants) + 1  # every variant renders differently here
    assert counting.calls == 1 + len(variants)
    for body in variants:  # each now served from its own entry
        assert _chat(server, body)["prompt_token_ids"] == _fresh_ids(tokenizer, counting.inner, body)
    assert counting.calls == 1 + len(variants)


def test_a_template_failure_is_still_a_400_each_time(server: SamplerServer) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"tools": 3}}
    for _ in range(2):
        status, raw = asyncio.run(server.post_whole("/chat/completions", body))
        assert status == 400, raw
    status, raw = asyncio.run(
        server.post_whole(
            "/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tools": "x"}
        )
    )
    assert (status, json.loads(raw)["error"]["param"]) == (400, "tools")


# Small alphabets and numbers, so two drawn values are often alike (1, 1.0, True, "1", -0.0, 0.0).
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-1, 1),
    st.sampled_from([0.0, -0.0, 1.0, 0.5]),
    st.text(alphabet="a1 ", max_size=2),
)
_json = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=2) | st.dictionaries(st.sampled_from(["a", "b", "1"]), inner, max_size=2)
    ),
    max_leaves=5,
)
_inputs = st.tuples(
    st.lists(st.dictionaries(st.sampled_from(["role", "content", "name"]), _json, max_size=3), max_size=2),
    st.booleans(),
    st.dictionaries(st.sampled_from(["tools", "x"]), _json, max_size=2),
)


def _strict(value: Any) -> Any:
    """``value`` with every type spelled out and dict order kept: equal iff a template (which may
    test types, iterate dicts in order, write ``tojson``) cannot tell the two apart."""
    if isinstance(value, dict):
        return ("dict", [(_strict(k), _strict(v)) for k, v in value.items()])
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [_strict(v) for v in value])
    if isinstance(value, float):
        return ("float", repr(value))
    return (type(value).__name__, value)


@settings(max_examples=100, deadline=None)
@given(_inputs, _inputs)
def test_two_renders_share_a_key_only_when_their_inputs_are_the_same(a: Any, b: Any) -> None:
    key_a, key_b = prompt_key(*a), prompt_key(*b)
    assert key_a is not None and key_b is not None
    assert (key_a == key_b) == (_strict(a) == _strict(b))


def test_inputs_json_cannot_hold_are_not_cached() -> None:
    class Opaque:
        pass

    assert prompt_key([{"role": "user", "content": "x"}], True, {"o": Opaque()}) is None
    assert prompt_key([{"role": "user", "content": "x"}], True, {"k": {(1, 2): 3}}) is None


def test_the_cache_is_bounded_by_its_keys_characters() -> None:
    cache = PromptCache(max_chars=1000)
    keys = [f"{i:<90}" for i in range(12)]  # 90 characters each: at most 11 fit in 1000
    for i, key in enumerate(keys[:11]):
        cache.put(key, [i])
    assert cache.get(keys[0]) == [0]  # now the most recently used
    cache.put(keys[11], [11])  # over 1000 characters: the least recently used entry goes
    assert cache.get(keys[1]) is None
    assert cache.get(keys[0]) == [0] and cache.get(keys[11]) == [11] and len(cache) == 11
    cache.put("x" * 101, [99])  # over a tenth of the bound: not kept
    assert cache.get("x" * 101) is None and len(cache) == 11
    got = cache.get(keys[0])
    assert got is not None
    got.append(99)  # a caller's list is its own
    assert cache.get(keys[0]) == [0]


class _GatedModel:
    """The model, whose first forward pass waits for the test (so requests queue meanwhile)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.config = model.config
        self.prefill_started = threading.Event()
        self.release = threading.Event()

    def __call__(self, **kwargs: Any) -> Any:
        if not self.prefill_started.is_set():
            self.prefill_started.set()
            assert self.release.wait(30), "the test never released the first prefill"
        return self.model(**kwargs)


def _gate(engine: SamplerEngine, prompt: list[int]) -> tuple[_GatedModel, Any]:
    """Holds the engine in a one-token request's prefill; its batch ends right after it."""
    gate = _GatedModel(engine.model)
    engine.model = cast(torch.nn.Module, gate)
    blocker = engine.submit(GenerationRequest(prompt_ids=prompt, max_tokens=1, ignore_eos=True))
    assert gate.prefill_started.wait(30)
    return gate, blocker


def test_a_decode_steps_answers_wake_the_callers_loop_once(server: SamplerServer) -> None:
    """Eight chat calls that end in the same decode step are answered in one wake-up of the
    caller's loop from the engine's thread, not one each."""
    engine = server.engine
    gate, blocker = _gate(engine, [5, 6, 7])

    async def main() -> list[tuple[int, bytes]]:
        loop = asyncio.get_running_loop()
        wakeups: list[str] = []
        inner = loop.call_soon_threadsafe

        def counting(callback: Any, *args: Any, **kwargs: Any) -> Any:
            wakeups.append(threading.current_thread().name)
            return inner(callback, *args, **kwargs)

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
        body = {
            "messages": [{"role": "user", "content": "say: apple"}],
            "max_tokens": 3,
            "ignore_eos": True,
            "temperature": 1.0,
        }
        calls = [asyncio.create_task(server.post_whole("/chat/completions", body)) for _ in range(8)]
        while engine._requests.queued() < 8:  # each task runs up to its wait for the engine, and the
            await asyncio.sleep(0)  # loop hands the eight over together when its iteration ends
        gate.release.set()  # the blocker ends after its prefill; the eight form the next batch
        answers = await asyncio.gather(*calls)
        assert wakeups.count("rllm-sampler-engine") == 1
        return answers

    answers = asyncio.run(main())
    assert blocker.result(timeout=60)
    for status, raw in answers:
        assert status == 200
        assert len(json.loads(raw)["choices"][0]["message"]["content"].split()) <= 3


def test_a_cancelled_waiter_costs_the_others_nothing(engine: SamplerEngine) -> None:
    gate, _ = _gate(engine, [5, 6, 7])

    async def main() -> None:
        given_up = engine.submit_async(GenerationRequest(prompt_ids=[5, 6], max_tokens=2, ignore_eos=True))
        other = engine.submit_async(GenerationRequest(prompt_ids=[7, 8], max_tokens=4, ignore_eos=True))
        assert given_up.cancel()
        gate.release.set()
        assert len((await other)[0].completion_ids) == 4
        assert given_up.cancelled()
        after = engine.submit_async(GenerationRequest(prompt_ids=[9], max_tokens=3, ignore_eos=True))
        assert len((await after)[0].completion_ids) == 3  # and the engine keeps serving

    asyncio.run(main())


def test_a_stopped_engine_fails_a_waiting_caller_on_its_loop(tool_model_path: Path) -> None:
    model = load_pretrained(str(tool_model_path), torch.float32, torch.device("cpu")).eval()
    engine = SamplerEngine(model, load_tokenizer(str(tool_model_path)), torch.device("cpu"), max_batch=4)

    async def main() -> None:
        waiting = engine.submit_async(GenerationRequest(prompt_ids=[5], max_tokens=1))  # never started
        engine.stop()
        with pytest.raises(RuntimeError, match="stopped before this request ran"):
            await waiting
        with pytest.raises(RuntimeError, match="stopped"):
            await engine.submit_async(GenerationRequest(prompt_ids=[5], max_tokens=1))

    asyncio.run(main())


def test_a_loops_calls_of_one_iteration_start_one_batch(engine: SamplerEngine) -> None:
    """Calls submitted in one iteration of a loop reach the engine together, however long the
    loop takes between them (an in-process gateway doing each flow's work in turn): one batch,
    one prefill, not a batch with the first and a join per later call."""

    async def main() -> None:
        batches, passes = engine.batches_run, engine.forward_passes
        waiters = []
        for word in range(8):
            waiters.append(
                engine.submit_async(
                    GenerationRequest(prompt_ids=[5, 6 + word], max_tokens=3, ignore_eos=True)
                )
            )
            # The next flow's own work before its call, on the loop (no await): long enough for
            # the engine to start a batch with the calls so far, were they handed over one by one
            # (it waits 1 ms for more).
            time.sleep(0.02)
        await asyncio.gather(*waiters)
        assert engine.batches_run - batches == 1
        assert engine.forward_passes - passes == 3  # the prefill and two decode steps

    asyncio.run(main())
