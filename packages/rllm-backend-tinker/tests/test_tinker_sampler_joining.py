"""Continuous batching in the local sampler: requests that arrive while a batch decodes join it
at its next decode step, and each still gets the tokens and logprobs it would get alone."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import torch
from tinker_helpers import running_sampler_engine, teacher_forced_logprobs

from rllm.backends.tinker.local.generation import GenerationRequest, SamplerEngine


class _GatedModel:
    """The model, whose first forward pass (the first batch's prefill) waits for the test: the
    requests the test sends meanwhile can only join the running batch, never start with it."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.config = model.config
        self.prefill_started = threading.Event()
        self.release = threading.Event()
        self.shapes: list[tuple[int, int]] = []  # each forward pass's input_ids shape

    def __call__(self, **kwargs: Any) -> Any:
        self.shapes.append((kwargs["input_ids"].shape[0], kwargs["input_ids"].shape[1]))
        if not self.prefill_started.is_set():
            self.prefill_started.set()
            assert self.release.wait(30), "the test never released the first prefill"
        return self.model(**kwargs)


@pytest.fixture
def engine(tiny_model_path: Path) -> Iterator[SamplerEngine]:
    with running_sampler_engine(tiny_model_path) as started:
        yield started


def _request(
    prompt: list[int], temperature: float, max_tokens: int, seed: int | None = None
) -> GenerationRequest:
    return GenerationRequest(
        prompt_ids=prompt, max_tokens=max_tokens, temperature=temperature, seed=seed, ignore_eos=True
    )


def _prompts(engine: SamplerEngine) -> list[list[int]]:
    encode = engine.tokenizer
    texts = ["say: apple", "say: river stone cloud tiger", "say: lemon piano", "say: rocket"]
    return [list(encode(t, add_special_tokens=False)["input_ids"]) for t in texts]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_joined_requests_get_what_they_get_alone(engine: SamplerEngine, temperature: float) -> None:
    prompts = _prompts(engine)
    # Different lengths, so the joiners' prompts are padded to each other and to the running rows.
    lengths = [8, 3, 6, 5]
    alone = [
        engine.submit(_request(p, temperature, n, seed=7)).result(timeout=60)[0]
        for p, n in zip(prompts, lengths, strict=True)
    ]

    gate = _GatedModel(engine.model)
    engine.model = cast(torch.nn.Module, gate)
    first = engine.submit(_request(prompts[0], temperature, lengths[0], seed=7))
    assert gate.prefill_started.wait(30)
    rest = [
        engine.submit(_request(p, temperature, n, seed=7))
        for p, n in zip(prompts[1:], lengths[1:], strict=True)
    ]
    joined_before, batches_before = engine.rows_joined, engine.batches_run
    gate.release.set()
    together = [f.result(timeout=60)[0] for f in [first, *rest]]

    assert engine.rows_joined - joined_before == 3  # all three joined the running batch
    assert engine.batches_run == batches_before  # and none started a batch of its own
    for prompt, a, b in zip(prompts, alone, together, strict=True):
        assert b.completion_ids == a.completion_ids
        assert torch.allclose(
            torch.tensor(b.completion_logprobs), torch.tensor(a.completion_logprobs), atol=1e-5
        )
        # The logprobs of the ids it got are the model's own, by a teacher-forced pass.
        forced = teacher_forced_logprobs(gate.model, prompt + b.completion_ids)[len(prompt) - 1 :]
        if temperature == 1.0:
            assert torch.allclose(torch.tensor(b.completion_logprobs), forced, atol=1e-4)


@pytest.mark.parametrize(
    "joiner_text",
    ["say: apple river stone cloud tiger lemon piano rocket apple river stone", "say: x"],
    ids=["wider-than-the-cache", "narrower-than-the-cache"],
)
def test_a_joiner_beside_many_running_rows_gets_what_it_gets_alone(
    engine: SamplerEngine, joiner_text: str
) -> None:
    """Beside four running rows a joiner's prompt is prefilled in a pass of its own (fused, the
    running rows would each pay for its width) and its cache stacked under theirs, left-padded
    to the wider of the two; every row still gets what it gets alone."""
    running_prompt = _prompts(engine)[1]
    joiner_prompt = list(engine.tokenizer(joiner_text, add_special_tokens=False)["input_ids"])
    running_request = GenerationRequest(
        prompt_ids=running_prompt, max_tokens=6, temperature=1.0, seed=3, n=4, ignore_eos=True
    )
    alone_running = engine.submit(running_request).result(timeout=60)
    alone_joiner = engine.submit(_request(joiner_prompt, 1.0, 5, seed=5)).result(timeout=60)[0]

    gate = _GatedModel(engine.model)
    engine.model = cast(torch.nn.Module, gate)
    running = engine.submit(running_request)
    assert gate.prefill_started.wait(30)
    joiner = engine.submit(_request(joiner_prompt, 1.0, 5, seed=5))
    joined_before = engine.rows_joined
    gate.release.set()
    together_running = running.result(timeout=60)
    together_joiner = joiner.result(timeout=60)[0]

    assert engine.rows_joined - joined_before == 1
    assert (1, len(joiner_prompt)) in gate.shapes  # the joiner's prefill, alone in its pass
    assert all(rows <= 4 or width == 1 for rows, width in gate.shapes)  # no fused pass
    for a, b in zip([*alone_running, alone_joiner], [*together_running, together_joiner], strict=True):
        assert b.completion_ids == a.completion_ids
        assert torch.allclose(
            torch.tensor(b.completion_logprobs), torch.tensor(a.completion_logprobs), atol=1e-5
        )
    forced = teacher_forced_logprobs(gate.model, joiner_prompt + together_joiner.completion_ids)
    assert torch.allclose(
        torch.tensor(together_joiner.completion_logprobs), forced[len(joiner_prompt) - 1 :], atol=1e-4
    )


def test_a_request_is_answered_when_its_own_rows_end(engine: SamplerEngine) -> None:
    """A short joiner does not wait for the long running request it joined."""
    prompts = _prompts(engine)
    gate = _GatedModel(engine.model)
    engine.model = cast(torch.nn.Module, gate)
    long = engine.submit(_request(prompts[0], 0.0, 40))
    assert gate.prefill_started.wait(30)
    short = engine.submit(_request(prompts[1], 0.0, 1))
    seen_long_done: list[bool] = []
    short.add_done_callback(lambda _: seen_long_done.append(long.done()))
    gate.release.set()
    assert len(short.result(timeout=60)[0].completion_ids) == 1
    assert len(long.result(timeout=60)[0].completion_ids) == 40
    assert seen_long_done == [False]


def test_a_caller_that_gave_up_costs_the_others_nothing(engine: SamplerEngine) -> None:
    """A request whose caller went away (its future cancelled, as ``asyncio.wrap_future`` does
    when an HTTP client disconnects) ends quietly: the rest of its batch is answered."""
    prompts = _prompts(engine)
    gate = _GatedModel(engine.model)
    engine.model = cast(torch.nn.Module, gate)
    given_up = engine.submit(_request(prompts[0], 0.0, 2))
    assert gate.prefill_started.wait(30)
    other = engine.submit(_request(prompts[1], 0.0, 6))  # joins, and outlives the given-up one
    assert given_up.cancel()
    gate.release.set()
    assert len(other.result(timeout=60)[0].completion_ids) == 6
    assert given_up.cancelled()
    after = engine.submit(_request(prompts[2], 0.0, 3))  # and the engine keeps serving
    assert len(after.result(timeout=60)[0].completion_ids) == 3


def test_a_waiting_weight_swap_stops_joins(engine: SamplerEngine) -> None:
    """Requests queued while a swap waits start after it, under the new weights."""
    prompts = _prompts(engine)
    gate = _GatedModel(engine.model)
    engine.model = cast(torch.nn.Module, gate)
    running = engine.submit(_request(prompts[0], 0.0, 4))
    assert gate.prefill_started.wait(30)
    swap_waiting = threading.Event()
    versions: list[int] = []

    def swap() -> None:
        swap_waiting.set()
        versions.append(engine.update_weights(lambda: None))

    swapper = threading.Thread(target=swap)
    swapper.start()
    assert swap_waiting.wait(30)
    while not engine._swaps_waiting:  # until the swap is counted (then it waits on the lock)
        swapper.join(0.001)
    later = engine.submit(_request(prompts[1], 0.0, 2))
    gate.release.set()
    swapper.join(60)
    assert running.result(timeout=60)[0].weight_version == 0
    assert later.result(timeout=60)[0].weight_version == versions[0] == 1
