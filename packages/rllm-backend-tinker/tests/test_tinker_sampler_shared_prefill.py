"""The local sampler prefills a batch's repeated prompts once (#35 round 8): a request's n choices
and a group's n=1 calls with the same prompt share one prefill row, whose keys, values and logits
are copied to each of them. Checked against the same batch prefilled row by row (the code before):
the same tokens, and the same logprobs up to float rounding (a matmul over 2 rows and one over 9
may round differently, as for a row that joins a running batch), seeded and unseeded.

Real parts: the tiny model, its SamplerEngine on its own thread, a real event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tinker_helpers import running_sampler_engine

from rllm.backends.tinker.local import decoding, prefill
from rllm.backends.tinker.local.generation import GeneratedSequence, GenerationRequest, SamplerEngine


@pytest.fixture
def engine(tiny_model_path: Path) -> Iterator[SamplerEngine]:
    with running_sampler_engine(tiny_model_path) as started:
        yield started


# Two prompts of one length (no padding), each asked several times: seeded n > 1, seeded n = 1
# calls of a group, and unseeded calls (drawn from the global generator, seeded per run below).
REQUESTS = [
    GenerationRequest(prompt_ids=[5, 6, 7], max_tokens=4, n=3, seed=5, ignore_eos=True),
    GenerationRequest(prompt_ids=[5, 6, 7], max_tokens=4, n=1, seed=11, ignore_eos=True),
    GenerationRequest(prompt_ids=[5, 6, 8], max_tokens=4, n=2, seed=3, ignore_eos=True),
    GenerationRequest(prompt_ids=[5, 6, 7], max_tokens=4, n=2, ignore_eos=True),
    GenerationRequest(prompt_ids=[5, 6, 8], max_tokens=4, n=1, ignore_eos=True),
]


def _one_batch(
    engine: SamplerEngine, requests: list[GenerationRequest] = REQUESTS
) -> list[list[GeneratedSequence]]:
    """``requests`` submitted in one loop iteration: one batch."""

    async def main() -> list[list[GeneratedSequence]]:
        torch.manual_seed(0)
        return list(await asyncio.gather(*(engine.submit_async(r) for r in requests)))

    batches = engine.batches_run
    answers = asyncio.run(main())
    assert engine.batches_run - batches == 1
    return answers


def test_repeated_prompts_share_one_prefill_with_the_same_tokens_and_logprobs(
    engine: SamplerEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared_before, passes_before = engine.rows_shared, engine.forward_passes
    shared = _one_batch(engine)
    assert engine.rows_shared - shared_before == 9 - 2  # nine rows, two distinct prompts
    assert engine.forward_passes - passes_before == 4  # one prefill, three decode steps

    # The reference: the same batch, every row prefilled on its own (as before sharing).
    monkeypatch.setattr(prefill, "unique_prompts", prefill.all_prompts)
    monkeypatch.setattr(decoding, "shared_prefix", lambda prompts: 0)  # nine [5, 6, ...]: whole
    shared_before = engine.rows_shared
    alone = _one_batch(engine)
    assert engine.rows_shared == shared_before

    for got, want in zip(shared, alone, strict=True):
        assert [s.completion_ids for s in got] == [s.completion_ids for s in want]
        for g, w in zip(got, want, strict=True):
            assert g.completion_logprobs == pytest.approx(w.completion_logprobs, abs=1e-5)
        assert [s.text for s in got] == [s.text for s in want]


def test_distinct_prompts_share_nothing(engine: SamplerEngine) -> None:
    async def main() -> None:
        requests = [GenerationRequest(prompt_ids=[5, 6 + i], max_tokens=2) for i in range(4)]
        await asyncio.gather(*(engine.submit_async(r) for r in requests))

    before = engine.rows_shared
    asyncio.run(main())
    assert engine.rows_shared == before


def test_completion_texts_are_the_tokenizers_and_short_ones_are_remembered(engine: SamplerEngine) -> None:
    async def main() -> list[list[GeneratedSequence]]:
        requests = [
            GenerationRequest(prompt_ids=[5, 6, 7], max_tokens=3, n=4, seed=1, ignore_eos=True),
            GenerationRequest(prompt_ids=[5, 6, 7], max_tokens=70, seed=2, ignore_eos=True),
        ]
        return list(await asyncio.gather(*(engine.submit_async(r) for r in requests)))

    short, long = asyncio.run(main())
    for seq in [*short, *long]:
        assert seq.text == engine.tokenizer.decode(seq.completion_ids, skip_special_tokens=True)
    assert {tuple(s.completion_ids) for s in short} <= set(engine._answers.texts)
    assert tuple(long[0].completion_ids) not in engine._answers.texts  # longer than the remembered ones


# Distinct prompts with a 36-token beginning in common (a system prompt's worth) and endings of
# different lengths: the beginning is prefilled once (1 row), the endings after it (left-padded).
BEGINNING = [5, 6, 7, 8, 9, 10, 11, 5, 6, 7, 8, 9] * 3
ALIKE = [
    GenerationRequest(prompt_ids=[*BEGINNING, 12], max_tokens=4, ignore_eos=True, temperature=0.0),
    GenerationRequest(prompt_ids=[*BEGINNING, 13, 14], max_tokens=4, n=2, seed=4, ignore_eos=True),
    GenerationRequest(prompt_ids=[*BEGINNING, 15, 16, 17], max_tokens=4, ignore_eos=True, temperature=0.0),
]


def test_distinct_prompts_that_begin_alike_prefill_the_beginning_once(
    engine: SamplerEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    before, passes, fast = engine.rows_prefix_shared, engine.forward_passes, engine.fast_prefills
    shared = _one_batch(engine, ALIKE)
    assert engine.rows_prefix_shared - before == 3  # three distinct prompts after one beginning
    assert engine.fast_prefills - fast == 1  # the endings ran through the fast step's kernels
    assert engine.forward_passes - passes == 2 + 3  # the beginning, the endings, three decode steps

    monkeypatch.setattr(decoding, "shared_prefix", lambda prompts: 0)  # the reference: whole prompts
    alone = _one_batch(engine, ALIKE)
    assert engine.rows_prefix_shared - before == 3
    for got, want in zip(shared, alone, strict=True):
        assert [s.completion_ids for s in got] == [s.completion_ids for s in want]
        for g, w in zip(got, want, strict=True):
            assert g.completion_logprobs == pytest.approx(w.completion_logprobs, abs=1e-5)


@given(
    beginning=st.lists(st.integers(0, 3), max_size=30),
    endings=st.lists(st.lists(st.integers(0, 3), max_size=6), min_size=1, max_size=5),
)
def test_shared_prefix_is_the_longest_common_beginning_worth_sharing(
    beginning: list[int], endings: list[list[int]]
) -> None:
    prompts = [[*beginning, *ending] for ending in endings]
    prompts = [p for p in prompts if p] or [[1]]
    common = prefill.shared_prefix(prompts)
    shortest = min(map(len, prompts))
    assert 0 <= common <= max(0, shortest - 1)  # every prompt keeps a token of its own
    assert all(p[:common] == prompts[0][:common] for p in prompts)
    if common:
        assert common * (len(prompts) - 1) >= prefill.MIN_SHARED_POSITIONS
    longest = 0  # the longest common beginning, capped as above
    while longest < shortest - 1 and len({p[longest] for p in prompts}) == 1:
        longest += 1
    worth = len(prompts) > 1 and longest * (len(prompts) - 1) >= prefill.MIN_SHARED_POSITIONS
    assert common == (longest if worth else 0)
