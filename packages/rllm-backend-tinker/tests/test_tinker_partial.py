"""Partial rollouts on the local sampler (``rollout.partial``): a weight sync aborts the calls in
flight and the gateway continues each from its token history on the new weights.

Real parts throughout: the tiny model's sampler engine and HTTP server, a cumulative-mode
gateway, the real openai client, a real optimizer step and weight sync. The sampler's model is
held at one decode step (a forward pre-hook waiting on an event) so the abort lands mid-call on
any machine; nothing waits on a guessed delay.
"""

from __future__ import annotations

import asyncio
import copy
import threading
from typing import Any

import openai
import pytest
import torch
from tinker_helpers import contrast_batch, teacher_forced_logprobs

from rllm.algos.config import AlgorithmConfig
from rllm.backends.tinker import TinkerBackend
from rllm.backends.tinker.local.generation import GenerationRequest, SamplerEngine
from rllm.gateway import GatewayClient, GatewayConfig, GatewayServer

MAX_TOKENS = 10


class _HoldAt:
    """Holds the sampler's ``at``-th forward pass (after arming) until the test releases it."""

    def __init__(self, model: torch.nn.Module, at: int) -> None:
        self.at, self.calls = at, 0
        self.reached, self.release = threading.Event(), threading.Event()
        self.handle = model.register_forward_pre_hook(self._hook)

    def _hook(self, module: torch.nn.Module, args: Any) -> None:
        self.calls += 1
        if self.calls == self.at:
            self.reached.set()
            assert self.release.wait(60), "the test never released the held forward pass"


def _engine(backend: TinkerBackend) -> SamplerEngine:
    engine = backend.service.engine
    assert engine is not None
    return engine


def test_abort_ends_calls_in_flight_with_their_tokens_and_spares_later_ones(
    sampler_backend: TinkerBackend,
) -> None:
    engine = _engine(sampler_backend)
    prompt = list(engine.tokenizer("say: apple", add_special_tokens=False)["input_ids"])
    request = GenerationRequest(prompt_ids=prompt, max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    (alone,) = engine.submit(request).result(timeout=60)
    hold = _HoldAt(engine.model, at=3)  # prefill, two decode steps: 3 tokens when released
    try:
        running = engine.submit(request)
        assert hold.reached.wait(60)
        engine.abort_all()
        later = engine.submit(request)  # submitted after the abort: untouched by it
        hold.release.set()
        (cut,) = running.result(timeout=60)
        (whole,) = later.result(timeout=60)
    finally:
        hold.handle.remove()
    assert cut.finish_reason == "abort"
    assert 1 <= len(cut.completion_ids) < MAX_TOKENS
    assert cut.completion_ids == alone.completion_ids[: len(cut.completion_ids)]  # greedy: a prefix
    assert cut.completion_logprobs == pytest.approx(
        alone.completion_logprobs[: len(cut.completion_ids)], abs=1e-4
    )
    assert whole.finish_reason == "length" and whole.completion_ids == alone.completion_ids


async def test_a_sync_aborts_calls_in_flight_and_continues_them_token_true(backend: TinkerBackend) -> None:
    engine = _engine(backend)
    old_model = copy.deepcopy(engine.model)  # the weights of version 0, to check each token against
    await backend.train_step(
        contrast_batch(backend), AlgorithmConfig()
    )  # the sampler keeps v0 until the sync
    cfg = GatewayConfig(
        upstreams=backend.inference_urls(),
        tokenizer_path=backend.tokenizer_path(),
        tokenizer_mode="cumulative",
        partial_rollouts=True,
        health_interval_s=0,
    )
    # Three calls decode together when the sync comes; a fourth is still queued at the sampler.
    words, queued = ["apple", "lemon", "plum"], "peach"
    aborted, submitted = threading.Event(), threading.Event()
    abort_all, submit = engine.abort_all, engine.submit

    def abort_and_tell() -> None:
        abort_all()
        aborted.set()

    def submit_and_tell(request: GenerationRequest) -> Any:
        future = submit(request)
        submitted.set()
        return future

    # The test learns when the abort and the queued call reached the engine.
    engine.abort_all = abort_and_tell  # type: ignore[method-assign]
    hold = _HoldAt(engine.model, at=3)
    async with GatewayServer(cfg) as gw, GatewayClient(gw.url) as admin:

        async def call(word: str) -> dict[str, Any]:
            async with openai.AsyncOpenAI(base_url=admin.session_url(word), api_key="x", max_retries=0) as c:
                reply = await c.chat.completions.create(
                    model=backend.served_model_name(),
                    messages=[{"role": "user", "content": f"say: {word}"}],
                    max_tokens=MAX_TOKENS,
                    temperature=1.0,
                    seed=3,
                    extra_body={"return_token_ids": True, "ignore_eos": True},
                )
            return reply.model_dump()

        try:
            calls = [asyncio.create_task(call(w)) for w in words]
            assert await asyncio.to_thread(hold.reached.wait, 60)  # the batch is mid-decode
            engine.submit = submit_and_tell  # type: ignore[method-assign]
            calls.append(asyncio.create_task(call(queued)))
            assert await asyncio.to_thread(submitted.wait, 60)
            pause = asyncio.create_task(gw.pause(60))
            assert await asyncio.to_thread(aborted.wait, 60)
            hold.release.set()
            await pause  # every call is parked with its tokens so far: none running, none lost
            assert (gw.ledger.inflight, gw.ledger.parked) == (4, 4)
            version = await backend.sync_weights()
            gw.set_weight_version(version)
            gw.resume()
            replies = await asyncio.gather(*calls)
        finally:
            hold.release.set()
            hold.handle.remove()
            engine.abort_all, engine.submit = abort_all, submit  # type: ignore[method-assign]
        traces = {w: await admin.get_traces(w) for w in [*words, queued]}
        assert gw.ledger.inflight == 0
    new_model = engine.model
    moved = 0
    for word, reply in zip([*words, queued], replies, strict=True):
        (trace,) = traces[word]
        choice = reply["choices"][0]
        ids = list(trace.completion_ids or [])
        # One reply: exactly the ids sampled, first on v0, then continued on v1.
        assert trace.status == "ok" and choice["token_ids"] == ids and len(ids) == MAX_TOKENS
        assert choice["finish_reason"] == "length"
        assert choice["message"]["content"] == backend.service.tokenizer.decode(ids, skip_special_tokens=True)
        spans = trace.metadata["version_spans"]
        assert sum(n for _, n in spans) == MAX_TOKENS
        if word == queued:  # aborted before its first token: re-sent whole on the new weights
            assert spans == [[version, MAX_TOKENS]] and trace.weight_version == version
            continue
        assert [v for v, _ in spans] == [0, version]
        assert trace.weight_version == 0  # the oldest: what the staleness bound checks
        # Each token's logprob is the one the version that sampled it gives it.
        prompt = list(trace.prompt_ids or [])
        tokens, cut = prompt + ids, spans[0][1]
        lp = list(trace.completion_logprobs or [])
        old = teacher_forced_logprobs(old_model, tokens)[len(prompt) - 1 :].tolist()
        new = teacher_forced_logprobs(new_model, tokens)[len(prompt) - 1 :].tolist()
        assert lp[:cut] == pytest.approx(old[:cut], abs=1e-4)
        assert lp[cut:] == pytest.approx(new[cut:], abs=1e-4)
        moved += sum(abs(a - b) > 1e-3 for a, b in zip(old[cut:], new[cut:], strict=True))
    assert moved > 0  # the sync really changed the weights the continuations ran on
