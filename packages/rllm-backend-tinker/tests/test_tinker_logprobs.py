"""Chunked token logprobs (local/logprobs.py) equal the plain full-vocabulary log-softmax: values,
entropy, a teacher's top-k and every gradient, padded and packed, LoRA and full weights."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rllm.algos.losses.distill import topk_and_tail
from rllm.backends.tinker.config import LoraConfig, TinkerBackendConfig
from rllm.backends.tinker.local.batching import PaddedBatch, pad
from rllm.backends.tinker.local.logprobs import (
    LogitHead,
    _head_skipped,
    check_head,
    chunk_positions,
    chunked_stats,
    token_stats,
)
from rllm.backends.tinker.local.model import load_policy
from rllm.backends.tinker.local.packing import pack_layout, plan_rows
from rllm.types import FloatArray, TokenArray, TrainSequence

TOL = 1e-5


def plain(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole log-softmax, then the targets' entries; the entropy as the trainer computed it
    before chunking (log-normaliser minus the softmax-weighted logits)."""
    logits = logits.float()
    logp = torch.log_softmax(logits, dim=-1)
    log_norm = torch.logsumexp(logits, dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1), log_norm - (logp.exp() * logits).sum(-1)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(0, 23),
    hidden=st.integers(1, 9),
    vocab=st.integers(2, 40),
    chunk=st.integers(1, 30),
    seed=st.integers(0, 2**16),
    entropy_grad=st.booleans(),
)
def test_chunked_logprobs_and_entropy_equal_the_plain_log_softmax_with_gradients(
    n: int, hidden: int, vocab: int, chunk: int, seed: int, entropy_grad: bool
) -> None:
    gen = torch.Generator().manual_seed(seed)
    head = torch.nn.Linear(hidden, vocab, bias=seed % 2 == 0)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    x = torch.randn((n, hidden), generator=gen).requires_grad_()
    targets = torch.randint(0, vocab, (n,), generator=gen)
    up_lp, up_ent = torch.randn(n, generator=gen), torch.randn(n, generator=gen)
    inputs = [x, *head.parameters()]

    want_lp, want_ent = plain(head(x), targets)
    want_loss = (want_lp * up_lp).sum() + ((want_ent * up_ent).sum() if entropy_grad else 0.0)
    want_grads = torch.autograd.grad(want_loss, inputs, allow_unused=True)

    lp, ent, top, tail = chunked_stats(
        head, x, targets, chunk=chunk, with_entropy=True, entropy_grad=entropy_grad
    )
    assert top is None and tail is None and ent is not None
    assert lp.shape == (n,) and ent.shape == (n,)
    torch.testing.assert_close(lp, want_lp, atol=TOL, rtol=TOL)
    torch.testing.assert_close(ent, want_ent.detach(), atol=TOL, rtol=TOL)
    assert ent.requires_grad == (entropy_grad and n > 0)
    if n == 0:
        return
    loss = (lp * up_lp).sum() + ((ent * up_ent).sum() if entropy_grad else 0.0)
    grads = torch.autograd.grad(loss, inputs, allow_unused=True)
    for got, want in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(got, want, atol=TOL, rtol=TOL)


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 17),
    vocab=st.integers(3, 30),
    k=st.integers(1, 3),
    chunk=st.integers(1, 20),
    seed=st.integers(0, 999),
)
def test_chunked_teacher_topk_equals_the_full_logits_topk_with_gradients(
    n: int, vocab: int, k: int, chunk: int, seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    head = torch.nn.Linear(5, vocab, bias=False)
    x = torch.randn((n, 5), generator=gen).requires_grad_()
    ids = torch.stack([torch.randperm(vocab, generator=gen)[: min(k, vocab)] for _ in range(n)])
    targets = ids[:, 0]
    up = torch.randn(ids.shape, generator=gen)

    want_top, want_tail = topk_and_tail(head(x).float(), ids)
    want = torch.autograd.grad((want_top * up).sum() + want_tail.sum(), [x, head.weight])
    _, _, top, tail = chunked_stats(head, x, targets, chunk=chunk, teacher_ids=ids)
    assert top is not None and tail is not None
    torch.testing.assert_close(top, want_top, atol=TOL, rtol=TOL)
    torch.testing.assert_close(tail, want_tail, atol=TOL, rtol=TOL)
    got = torch.autograd.grad((top * up).sum() + tail.sum(), [x, head.weight])
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=TOL, rtol=TOL)


def sequences(lengths: list[int], prompt: int, vocab: int, seed: int = 0) -> list[TrainSequence]:
    rng = np.random.default_rng(seed)
    out = []
    for n in lengths:
        mask = [0.0] * min(prompt, n - 1) + [1.0] * (n - min(prompt, n - 1))
        out.append(
            TrainSequence(
                input_ids=TokenArray(rng.integers(0, vocab, n).tolist()),
                loss_mask=FloatArray(mask),
                advantages=FloatArray([1.0] * n),
                sampler_logprobs=FloatArray([0.0] * n),
            )
        )
    return out


def policy(path: Path, rank: int) -> torch.nn.Module:
    config = TinkerBackendConfig(model=str(path), dtype="float32", lora=LoraConfig(rank=rank))
    return load_policy(config, torch.device("cpu"), torch.float32)


def plain_model_logprobs(model: torch.nn.Module, batch: PaddedBatch) -> torch.Tensor:
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).logits
    return plain(logits[:, :-1], batch.targets)[0]


@pytest.mark.parametrize("rank", [0, 4])
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("chunk", [1, 7, 1000])
def test_token_stats_of_a_model_equal_the_plain_forward_at_trained_positions(
    tiny_model_path: Path, rank: int, packed: bool, chunk: int
) -> None:
    model = policy(tiny_model_path, rank)
    vocab = model.get_output_embeddings().weight.shape[0]
    batch = sequences([9, 5, 12, 7], prompt=3, vocab=vocab)
    padded = pad(batch, list(range(len(batch))), 0, torch.device("cpu"))
    params = [p for p in model.parameters() if p.requires_grad]
    weights = torch.randn(padded.mask.shape, generator=torch.Generator().manual_seed(1))

    want = plain_model_logprobs(model, padded)
    want_grads = torch.autograd.grad((want * padded.mask * weights).sum(), params)
    if packed:
        lengths = {i: len(s.input_ids) for i, s in enumerate(batch)}
        rows = plan_rows(lengths, list(lengths), 20)
        order = [i for row in rows for i in row]
        padded = pad(batch, order, 0, torch.device("cpu"))
        padded.packed = pack_layout(batch, rows, 0, torch.device("cpu"), "sdpa", torch.float32)
        want, weights = want[order], weights[order]
        want_grads = torch.autograd.grad(
            (plain_model_logprobs(model, padded) * padded.mask * weights).sum(), params
        )

    got = token_stats(model, LogitHead(model), padded, chunk=chunk).logprobs
    trained = padded.mask != 0
    torch.testing.assert_close(got[trained], want[trained], atol=TOL, rtol=TOL)
    assert bool((got[~trained] == 0).all())
    grads = torch.autograd.grad((got * padded.mask * weights).sum(), params)
    for g, w in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, atol=TOL, rtol=TOL)


def test_a_model_whose_logits_are_not_its_head_falls_back_to_its_own_logits(
    tiny_model_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A transform rLLM cannot read from the config is caught at start-up: one warning line, and
    the logprobs are still the model's own."""
    model = policy(tiny_model_path, 0)

    def doubled(module: torch.nn.Module, args: object, output: object) -> object:
        output.logits = output.logits * 2  # pyright: ignore[reportAttributeAccessIssue]
        return output

    model.register_forward_hook(doubled)
    vocab = model.get_output_embeddings().weight.shape[0]
    with caplog.at_level(logging.WARNING):
        head = check_head(model, LogitHead(model), vocab)
    assert not head.exact
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and "\n" not in lines[0] and "LlamaForCausalLM" in lines[0]
    padded = pad(sequences([6, 9], prompt=2, vocab=vocab), [0, 1], 0, torch.device("cpu"))
    with torch.no_grad():
        want = plain_model_logprobs(model, padded)
        got = token_stats(model, head, padded, chunk=3).logprobs
    trained = padded.mask != 0
    torch.testing.assert_close(got[trained], want[trained], atol=TOL, rtol=TOL)
    fresh = policy(tiny_model_path, 0)
    assert check_head(fresh, LogitHead(fresh), vocab).exact


def test_the_skipped_head_is_only_skipped_on_the_calling_thread(tiny_model_path: Path) -> None:
    """A sampler sharing the module (sampler_weights="shared") keeps its full logits meanwhile."""
    model = policy(tiny_model_path, 0)
    ids = torch.tensor([[1, 2, 3, 4]])
    other: list[torch.Tensor] = []
    with torch.no_grad(), _head_skipped(model.get_output_embeddings()) as seen:
        thread = threading.Thread(target=lambda: other.append(model(input_ids=ids).logits))
        thread.start()
        thread.join()
        mine = model(input_ids=ids).logits
    assert other[0].shape == (1, 4, model.config.vocab_size)
    assert mine.shape[1] == 0 and len(seen) == 1 and seen[0].shape == (1, 4, model.config.hidden_size)


def test_auto_chunk_keeps_a_chunk_near_64_mib_of_float32_logits() -> None:
    assert chunk_positions(49152) == 341
    assert chunk_positions(151936) == 110
    assert chunk_positions(10**9) == 16
