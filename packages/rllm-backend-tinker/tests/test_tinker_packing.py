"""Sequence packing on the local trainer: packed rows give the loss, gradients and logprobs of
one sequence a row (attention stays inside each sequence)."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tinker_helpers import WORDS, reply_sequence, started_backend

from rllm.algos.config import AlgorithmConfig
from rllm.backends.tinker import TinkerBackend
from rllm.backends.tinker.config import TinkerBackendConfig
from rllm.backends.tinker.local.packing import plan_packed_micro_batches, plan_rows
from rllm.backends.tinker.local.trainer import LocalTrainer
from rllm.types import FloatArray, TokenArray, TrainSequence


def mixed_batch(backend: TinkerBackend) -> list[TrainSequence]:
    """Replies of 1 to 8 words: lengths differ, so rows hold several sequences of unequal size."""
    replies = [" ".join(WORDS[: k % 8 + 1]) for k in (0, 7, 2, 5, 1, 3)]
    return [
        reply_sequence(backend, WORDS[k], reply, 1.0 if k % 2 else -0.5) for k, reply in enumerate(replies)
    ]


def run_forward_backward(
    backend: TinkerBackend, batch: list[TrainSequence], algo: AlgorithmConfig, attention: str, **options: int
) -> tuple[dict[str, float], torch.Tensor, list[list[float]]]:
    model = copy.deepcopy(backend.service.trainer.model)
    model.set_attn_implementation(attention)
    config = TinkerBackendConfig(model="unused", **options)
    trainer = LocalTrainer(model, config, backend.service.device, 0)
    batch = copy.deepcopy(batch)
    metrics = trainer.forward_backward(batch, list(range(len(batch))), algo, None, record_logprobs=True)
    grads = torch.cat([p.grad.flatten() for p in trainer.params if p.grad is not None]).cpu()
    return metrics, grads, [list(s.trainer_logprobs or []) for s in batch]


@pytest.fixture(scope="module")
def packing_backend(tiny_model_path: Path) -> TinkerBackend:
    backend = started_backend(tiny_model_path)
    yield backend  # pyright: ignore[reportReturnType]
    asyncio.run(backend.close())


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_packed_and_unpacked_give_the_same_loss_gradients_and_logprobs(
    packing_backend: TinkerBackend, attention: str, aggregation: str
) -> None:
    batch = mixed_batch(packing_backend)
    lengths = {i: len(s.input_ids) for i, s in enumerate(batch)}
    pack = max(lengths.values()) + min(lengths.values())
    rows = plan_rows(lengths, list(lengths), pack)
    assert len(rows) < len(batch) and any(len(row) > 1 for row in rows)  # it really packs
    algo = AlgorithmConfig(loss="ppo_clip", aggregation=aggregation, entropy_coef=0.01)
    base_metrics, base_grads, base_logprobs = run_forward_backward(packing_backend, batch, algo, attention)
    for options in ({"pack_tokens": pack}, {"pack_tokens": pack, "micro_batch_tokens": pack}):
        metrics, grads, logprobs = run_forward_backward(packing_backend, batch, algo, attention, **options)
        assert metrics["loss"] == pytest.approx(base_metrics["loss"], abs=1e-5), options
        assert metrics["entropy"] == pytest.approx(base_metrics["entropy"], abs=1e-5), options
        assert metrics["num_sequences"] == base_metrics["num_sequences"] == len(batch)
        assert torch.allclose(grads, base_grads, atol=1e-5, rtol=0), (
            options,
            (grads - base_grads).abs().max(),
        )
        for got, want in zip(logprobs, base_logprobs, strict=True):
            assert got == pytest.approx(want, abs=1e-5)


def test_packed_eval_loss_matches_and_train_step_trains(packing_backend: TinkerBackend) -> None:
    batch = mixed_batch(packing_backend)
    losses = []
    for options in ({}, {"pack_tokens": 64}):
        model = copy.deepcopy(packing_backend.service.trainer.model)
        trainer = LocalTrainer(
            model,
            TinkerBackendConfig(model="unused", learning_rate=1e-2, **options),
            packing_backend.service.device,
            0,
        )
        losses.append(trainer.eval_loss(batch)["loss"])
        algo = AlgorithmConfig(loss="cross_entropy")
        first = trainer.train_step(copy.deepcopy(batch), algo)["loss"]
        for _ in range(3):
            last = trainer.train_step(copy.deepcopy(batch), algo)["loss"]
        assert last < first, options
    assert losses[1] == pytest.approx(losses[0], abs=1e-5)


def test_packing_refuses_images_and_unsupported_attention(packing_backend: TinkerBackend) -> None:
    from rllm.backends.tinker.local.packing import pack_layout
    from rllm.types.errors import InputError

    batch = mixed_batch(packing_backend)
    device = packing_backend.service.device
    with pytest.raises(InputError, match="flash_attention_2"):
        pack_layout(batch, [[0, 1]], 0, device, "flash_attention_2", torch.float32)
    with_image = copy.deepcopy(batch[0])
    with_image.images = ["data:image/png;base64,AAAA"]
    with pytest.raises(InputError, match="images"):
        pack_layout([with_image], [[0]], 0, device, "sdpa", torch.float32)


def test_remote_service_refuses_pack_tokens() -> None:
    backend = TinkerBackend({"service": "remote", "model": "m", "lora": {"rank": 8}, "pack_tokens": 512})
    with pytest.raises(ValueError, match="pack_tokens"):
        backend.validate(AlgorithmConfig(loss="cross_entropy"))


@given(
    lengths=st.lists(st.integers(min_value=2, max_value=40), min_size=1, max_size=30),
    pack=st.integers(min_value=2, max_value=60),
    micro=st.integers(min_value=0, max_value=200),
)
def test_packing_plan_places_every_sequence_once_within_its_row(
    lengths: list[int], pack: int, micro: int
) -> None:
    batch = [
        TrainSequence(
            input_ids=TokenArray([1] * n),
            loss_mask=FloatArray([1.0] * n),
            advantages=FloatArray([0.0] * n),
            sampler_logprobs=FloatArray([0.0] * n),
        )
        for n in lengths
    ]
    pieces = plan_packed_micro_batches(batch, list(range(len(batch))), pack, micro)
    rows = [row for piece in pieces for row in piece]
    assert sorted(i for row in rows for i in row) == list(range(len(batch)))
    for row in rows:
        assert len(row) == 1 or sum(lengths[i] for i in row) <= pack
    for piece in pieces:
        widest = max(sum(lengths[i] for i in row) for row in piece)
        assert len(piece) == 1 or micro == 0 or len(piece) * widest <= micro


def test_packed_positions_restart_and_attention_stays_inside_each_sequence(
    packing_backend: TinkerBackend,
) -> None:
    # (RoPE alone is blind to a shared offset, so the layout itself is pinned here.)
    from rllm.backends.tinker.local.packing import pack_layout

    batch = mixed_batch(packing_backend)[:2]
    n, m = (len(s.input_ids) for s in batch)
    layout = pack_layout(batch, [[0, 1]], 0, packing_backend.service.device, "sdpa", torch.float32)
    assert layout.position_ids.cpu().tolist() == [[*range(n), *range(m)]]
    allowed = layout.attention_mask[0, 0].cpu()
    assert allowed[n:, :n].sum() == 0 and allowed[:n, n:].sum() == 0  # no attention across sequences
    assert torch.equal(allowed[:n, :n], torch.ones(n, n, dtype=torch.bool).tril())
    assert torch.equal(allowed[n:, n:], torch.ones(m, m, dtype=torch.bool).tril())
