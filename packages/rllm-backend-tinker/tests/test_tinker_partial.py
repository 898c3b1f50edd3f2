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
        # The input embeddings run once per forward pass, transformers' or the fast decode step.
        self.handle = model.get_input_embeddings().register_forward_pre_hook(self._hook)

    def _hook(self, module: torch.nn.Module, args: Any) -> None:
        self.calls += 1
        if self.calls == self.at:
            self.reached.set()
            assert self.release.wait(60), "the test never released the held forward pass"


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


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
    scratch = copy.deepcopy(engine.model)  # scores tokens with each version's weights
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
    abort_all, submit = engine.abort_all, engine.submit_async  # (the server's way in)

    def abort_and_tell() -> None:
        abort_all()
        aborted.set()

    def submit_and_tell(request: GenerationRequest) -> Any:
        future = submit(request)
        submitted.set()
        return future

    # The test learns when the abort and the queued call reached the engine.
    engine.abort_all = abort_and_tell  # type: ignore[method-assign]
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

        async def sync_while_held(hold: _HoldAt) -> int:
            """Pause while ``hold`` holds the batch mid-decode (the abort lands first), then
            train and sync; once the caller resumes, the parked calls continue on the new version."""
            pause = asyncio.create_task(gw.pause(60))
            assert await asyncio.to_thread(aborted.wait, 60)
            aborted.clear()
            hold.release.set()
            await pause  # every call is parked with its tokens so far: none running, none lost
            assert gw.ledger.inflight == gw.ledger.parked
            weights[engine.weight_version] = _weights(engine.model)
            await backend.train_step(contrast_batch(backend), AlgorithmConfig())
            version = await backend.sync_weights()
            gw.set_weight_version(version)
            return version

        weights: dict[int, dict[str, torch.Tensor]] = {}
        holds = [_HoldAt(engine.model, at=3)]
        try:
            calls = [asyncio.create_task(call(w)) for w in words]
            assert await asyncio.to_thread(holds[0].reached.wait, 60)  # the batch is mid-decode
            engine.submit_async = submit_and_tell  # type: ignore[method-assign]
            calls.append(asyncio.create_task(call(queued)))
            assert await asyncio.to_thread(submitted.wait, 60)
            await sync_while_held(holds[0])
            assert gw.ledger.parked == 4
            holds.append(_HoldAt(engine.model, at=3))  # the continuations' batch, held in turn
            gw.resume()
            assert await asyncio.to_thread(holds[1].reached.wait, 60)
            # Calls continued by then are aborted again; any not yet at the sampler finish on v1.
            await sync_while_held(holds[1])
            gw.resume()
            replies = await asyncio.gather(*calls)
        finally:
            for hold in holds:
                hold.release.set()
                hold.handle.remove()
            engine.abort_all, engine.submit_async = abort_all, submit  # type: ignore[method-assign]
        traces = {w: await admin.get_traces(w) for w in [*words, queued]}
        assert gw.ledger.inflight == 0
    weights[engine.weight_version] = _weights(engine.model)

    def logprobs(version: int, tokens: list[int], prompt: list[int]) -> list[float]:
        scratch.load_state_dict(weights[version])
        return teacher_forced_logprobs(scratch, tokens)[len(prompt) - 1 :].tolist()

    moved = aborted_twice = 0
    for word, reply in zip([*words, queued], replies, strict=True):
        (trace,) = traces[word]
        choice = reply["choices"][0]
        ids = list(trace.completion_ids or [])
        # One reply: exactly the ids sampled, across the versions that sampled them.
        assert trace.status == "ok" and choice["token_ids"] == ids and len(ids) == MAX_TOKENS
        assert choice["finish_reason"] == "length"
        assert choice["message"]["content"] == backend.service.tokenizer.decode(ids, skip_special_tokens=True)
        spans = trace.metadata["version_spans"]
        versions = [v for v, _ in spans]
        assert sum(n for _, n in spans) == MAX_TOKENS and all(n > 0 for _, n in spans)
        assert versions == sorted(set(versions)) and set(versions) <= set(weights)
        assert trace.weight_version == versions[0]  # the oldest: what the staleness bound checks
        # The queued call was aborted before its first token: nothing of it is from v0.
        assert (versions[0] == 0) == (word != queued)
        aborted_twice += len(spans) == 3
        # Each token's logprob is the one the version that sampled it gives it.
        prompt = list(trace.prompt_ids or [])
        lp, at = list(trace.completion_logprobs or []), 0
        for version, n in spans:
            want = logprobs(version, prompt + ids, prompt)
            assert lp[at : at + n] == pytest.approx(want[at : at + n], abs=1e-4)
            if version != 0:
                v0 = logprobs(0, prompt + ids, prompt)
                moved += sum(
                    abs(a - b) > 1e-3 for a, b in zip(v0[at : at + n], want[at : at + n], strict=True)
                )
            at += n
    assert aborted_twice >= 1  # the batch held at the second sync was continued again
    assert moved > 0  # the syncs really changed the weights the continuations ran on


async def test_a_stream_aborted_at_a_sync_continues_on_the_same_client_stream_token_true(
    backend: TinkerBackend,
) -> None:
    """A chat stream (cumulative mode) and then a completions stream, each aborted mid-decode by
    a sync and continued on the new weights: each client reads one token-true stream."""
    engine = _engine(backend)
    tokenizer = backend.service.tokenizer
    scratch = copy.deepcopy(engine.model)
    cfg = GatewayConfig(
        upstreams=backend.inference_urls(),
        tokenizer_path=backend.tokenizer_path(),
        tokenizer_mode="cumulative",
        partial_rollouts=True,
        health_interval_s=0,
    )
    aborted, abort_all = threading.Event(), engine.abort_all

    def abort_and_tell() -> None:
        abort_all()
        aborted.set()

    engine.abort_all = abort_and_tell  # type: ignore[method-assign]
    weights: dict[int, dict[str, torch.Tensor]] = {}
    async with GatewayServer(cfg) as gw, GatewayClient(gw.url) as admin:

        async def synced_while_streaming(session: str, chat: bool) -> tuple[list[Any], Any]:
            """The stream's chunks and the call's trace, a sync landing after its second token."""
            chunks: list[Any] = []
            first_tokens = asyncio.Event()  # the client has the tokens sampled before the sync
            common: dict[str, Any] = {
                "model": backend.served_model_name(),
                "max_tokens": MAX_TOKENS,
                "temperature": 1.0,
                "seed": 3,
                "stream": True,
                "stream_options": {"include_usage": True},
            }

            async def consume() -> None:
                async with openai.AsyncOpenAI(
                    base_url=admin.session_url(session), api_key="x", max_retries=0
                ) as c:
                    if chat:
                        stream: Any = await c.chat.completions.create(
                            messages=[{"role": "user", "content": "say: apple"}],
                            logprobs=True,
                            extra_body={"ignore_eos": True},
                            **common,
                        )
                    else:
                        stream = await c.completions.create(
                            prompt="say: lemon",
                            logprobs=1,
                            extra_body={"ignore_eos": True, "return_token_ids": True},
                            **common,
                        )
                    async for chunk in stream:
                        chunks.append(chunk)
                        if chunk.choices and chunk.choices[0].logprobs:
                            first_tokens.set()

            hold = _HoldAt(engine.model, at=3)  # prefill, two decode steps
            try:
                reader = asyncio.create_task(consume())
                assert await asyncio.to_thread(hold.reached.wait, 60)
                pause = asyncio.create_task(gw.pause(60))
                assert await asyncio.to_thread(aborted.wait, 60)
                aborted.clear()
                hold.release.set()
                await pause
                assert gw.ledger.parked == 1
                # Streamed already: what the old version sampled reached the client before the sync.
                await asyncio.wait_for(first_tokens.wait(), 60)
                weights[engine.weight_version] = _weights(engine.model)
                await backend.train_step(contrast_batch(backend), AlgorithmConfig())
                gw.set_weight_version(await backend.sync_weights())
                gw.resume()
                await reader
            finally:
                hold.release.set()
                hold.handle.remove()
            (trace,) = await admin.get_traces(session)
            return chunks, trace

        try:
            streamed = [
                await synced_while_streaming("chat", True),
                await synced_while_streaming("text", False),
            ]
        finally:
            engine.abort_all = abort_all  # type: ignore[method-assign]
    weights[engine.weight_version] = _weights(engine.model)
    for (chunks, trace), chat, versions in zip(streamed, (True, False), ([0, 1], [1, 2]), strict=True):
        ids, prompt = list(trace.completion_ids or []), list(trace.prompt_ids or [])
        assert trace.status == "ok" and len(ids) == MAX_TOKENS
        spans = trace.metadata["version_spans"]
        assert [v for v, _ in spans] == versions and all(n > 0 for _, n in spans)
        assert sum(n for _, n in spans) == MAX_TOKENS and trace.weight_version == versions[0]
        # One stream: one id, one finish (the real one, never the abort).
        assert len({c.id for c in chunks}) == 1
        finishes = [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason]
        assert finishes == ["length"]
        # Token-true: the client saw exactly the sampled tokens, their logprobs and their text.
        if chat:
            entries = [
                e for c in chunks for ch in c.choices if ch.logprobs for e in ch.logprobs.content or ()
            ]
            tokens, lps = [e.token for e in entries], [e.logprob for e in entries]
            text = "".join(ch.delta.content or "" for c in chunks for ch in c.choices)
        else:
            lp = [ch.logprobs for c in chunks for ch in c.choices if ch.logprobs]
            tokens = [t for x in lp for t in x.tokens or ()]
            lps = [v for x in lp for v in x.token_logprobs or ()]
            text = "".join(ch.text for c in chunks for ch in c.choices)
            seen = [
                t for c in chunks for ch in c.choices for t in (ch.model_extra or {}).get("token_ids") or ()
            ]
            assert seen == ids
        # The final usage (chat too) counts the first prompt and every token of the call.
        usage = chunks[-1].usage
        assert usage is not None and chunks[-1].choices == []
        assert (usage.prompt_tokens, usage.completion_tokens) == (len(prompt), MAX_TOKENS)
        assert [c.usage for c in chunks[:-1]] == [None] * (len(chunks) - 1)
        assert tokens == [tokenizer.decode([t]) for t in ids]
        assert lps == pytest.approx(list(trace.completion_logprobs or []), abs=1e-6)
        assert text == tokenizer.decode(ids, skip_special_tokens=True)
        # Each token's logprob is the one the version that sampled it gives it.
        at = 0
        for version, n in spans:
            scratch.load_state_dict(weights[version])
            want = teacher_forced_logprobs(scratch, prompt + ids)[len(prompt) - 1 :].tolist()
            assert lps[at : at + n] == pytest.approx(want[at : at + n], abs=1e-4)
            at += n
