"""Sequences whose advantages are 0 everywhere are left out of the local trainer's passes, and
the update is still exactly the whole batch's: same gradient, same optimizer step (a step on a
zero gradient when nothing else is left), same loss. Configs where such rows do carry gradient
(entropy bonus, a supervised loss, a width-scaled aggregation, a registered loss that does not
declare itself inert) or where every row's logprobs are wanted (``max_mismatch``) compute them all."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from tinker_helpers import contrast_batch, reply_sequence, started_backend

import rllm.backends.tinker.local.trainer as trainer_module
from rllm.algos import register_loss, unregister_loss
from rllm.algos.config import AlgorithmConfig
from rllm.algos.losses import zero_advantage_rows_inert
from rllm.algos.losses.policy import ppo_clip
from rllm.backends.tinker import TinkerBackend
from rllm.backends.tinker.config import TinkerBackendConfig
from rllm.backends.tinker.local.trainer import LocalTrainer
from rllm.types import TrainSequence


@pytest.fixture(scope="module")
def frozen_backend(tiny_model_path: Path) -> Iterator[TinkerBackend]:
    """A backend whose model is only copied (each test trains its own copies)."""
    backend = started_backend(tiny_model_path)
    yield backend
    asyncio.run(backend.close())


def with_inert_rows(backend: TinkerBackend) -> list[TrainSequence]:
    """The contrast batch plus three zero-advantage rows of other lengths, between its rows."""
    signal = contrast_batch(backend)
    inert = [
        reply_sequence(backend, "mango", "mango", 0.0),
        reply_sequence(backend, "peach", "peach peach plum", 0.0),
        reply_sequence(backend, "grape", "lemon", 0.0),
    ]
    return [signal[0], inert[0], signal[1], inert[1], signal[2], inert[2], signal[3]]


def all_inert(backend: TinkerBackend) -> list[TrainSequence]:
    return [reply_sequence(backend, w, r, 0.0) for w, r in (("mango", "mango"), ("plum", "cherry"))]


class CountedTrainer:
    """A LocalTrainer on a fresh copy of the backend's model, counting the rows its model runs."""

    def __init__(self, backend: TinkerBackend, tiny_model_path: Path, **options: object) -> None:
        model = copy.deepcopy(backend.service.trainer.model)
        config = TinkerBackendConfig(model=str(tiny_model_path), learning_rate=1e-2, **options)
        self.trainer = LocalTrainer(model, config, backend.service.device, 0)
        self.rows = 0
        model.register_forward_pre_hook(self._count, with_kwargs=True)

    def _count(self, _module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.rows += int(ids.shape[0])

    def gradient(self, batch: list[TrainSequence], algo: AlgorithmConfig) -> torch.Tensor:
        self.trainer.forward_backward(batch, list(range(len(batch))), algo, None)
        return torch.cat([p.grad.flatten() for p in self.trainer.params]).cpu()

    def params(self) -> torch.Tensor:
        return torch.cat([p.detach().flatten() for p in self.trainer.params]).cpu()


@pytest.mark.parametrize(
    ("loss", "aggregation"),
    [
        ("ppo_clip", "token-mean"),
        ("ppo_clip", "seq-mean-token-mean"),
        ("gspo", "seq-mean-token-sum"),
        ("cispo", "token-sum"),
        ("importance_sampling", "token-mean"),
    ],
)
def test_left_out_rows_give_the_whole_batchs_gradient(
    frozen_backend: TinkerBackend,
    tiny_model_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    loss: str,
    aggregation: str,
) -> None:
    batch = with_inert_rows(frozen_backend)
    algo = AlgorithmConfig(loss=loss, aggregation=aggregation)
    skipping = CountedTrainer(frozen_backend, tiny_model_path)
    fast = skipping.gradient(batch, algo)
    monkeypatch.setattr(trainer_module, "zero_advantage_rows_inert", lambda _algo: False)
    everything = CountedTrainer(frozen_backend, tiny_model_path)
    reference = everything.gradient(batch, algo)
    assert (skipping.rows, everything.rows) == (4, 7)
    assert fast.abs().max() > 0
    assert torch.allclose(fast, reference, atol=1e-7, rtol=1e-5)


def test_micro_batches_and_left_out_rows_together(
    frozen_backend: TinkerBackend, tiny_model_path: Path
) -> None:
    batch = with_inert_rows(frozen_backend)
    algo = AlgorithmConfig(loss="ppo_clip", aggregation="token-mean")
    whole = CountedTrainer(frozen_backend, tiny_model_path).gradient(batch, algo)
    micro = CountedTrainer(frozen_backend, tiny_model_path, micro_batch_tokens=12)
    assert torch.allclose(micro.gradient(batch, algo), whole, atol=1e-7, rtol=1e-4)
    assert micro.rows == 4


def test_updates_match_with_an_all_inert_batch_moving_on_momentum(
    frozen_backend: TinkerBackend, tiny_model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    algo = AlgorithmConfig(loss="ppo_clip")
    signal, idle = contrast_batch(frozen_backend), all_inert(frozen_backend)

    def two_updates(counted: CountedTrainer) -> tuple[dict[str, float], float, int]:
        trainer = counted.trainer
        trainer.forward_backward(signal, list(range(len(signal))), algo, None)
        trainer.optim_step()
        rows = counted.rows
        metrics = trainer.forward_backward(idle, list(range(len(idle))), algo, None)
        return metrics, trainer.optim_step(), counted.rows - rows

    skipping = CountedTrainer(frozen_backend, tiny_model_path)
    metrics, norm, rows = two_updates(skipping)
    assert rows == 0  # no forward pass at all
    assert metrics["inert_sequences"] == 2.0 and metrics["loss"] == 0.0 and norm == 0.0
    assert skipping.trainer.optimizer_steps == 2  # the zero-gradient step was taken

    monkeypatch.setattr(trainer_module, "zero_advantage_rows_inert", lambda _algo: False)
    everything = CountedTrainer(frozen_backend, tiny_model_path)
    reference, _, rows = two_updates(everything)
    assert rows == 2
    # Adam's momentum from the first update moved both the same way
    assert torch.allclose(everything.params(), skipping.params(), atol=1e-7, rtol=1e-5)
    assert reference["num_tokens"] == metrics["num_tokens"]


def test_a_train_step_that_records_token_truth_computes_every_row(
    frozen_backend: TinkerBackend, tiny_model_path: Path
) -> None:
    counted = CountedTrainer(frozen_backend, tiny_model_path)
    batch = with_inert_rows(frozen_backend)
    counted.trainer.train_step(batch, AlgorithmConfig(loss="ppo_clip"))
    assert counted.rows == 7 and all(seq.trainer_logprobs is not None for seq in batch)


def test_an_inert_call_keeps_gradient_accumulated_before_it(
    frozen_backend: TinkerBackend, tiny_model_path: Path
) -> None:
    algo = AlgorithmConfig(loss="ppo_clip")
    counted = CountedTrainer(frozen_backend, tiny_model_path)
    first = counted.gradient(contrast_batch(frozen_backend), algo)
    assert torch.equal(counted.gradient(all_inert(frozen_backend), algo), first)


@pytest.mark.parametrize(
    "algo",
    [
        AlgorithmConfig(loss="ppo_clip", entropy_coef=0.01),
        AlgorithmConfig(loss="cross_entropy"),
        AlgorithmConfig(loss="ppo_clip", aggregation="seq-mean-token-sum-norm"),
        AlgorithmConfig(loss="ppo_clip", max_mismatch=10.0),
    ],
    ids=["entropy", "supervised", "width-scaled", "max_mismatch"],
)
def test_configs_where_zero_advantage_rows_count_compute_every_row(
    frozen_backend: TinkerBackend, tiny_model_path: Path, algo: AlgorithmConfig
) -> None:
    counted = CountedTrainer(frozen_backend, tiny_model_path)
    counted.gradient(with_inert_rows(frozen_backend), algo)
    assert counted.rows == 7


def test_a_registered_loss_is_inert_only_when_it_says_so() -> None:
    register_loss("plain_clip")(ppo_clip)
    register_loss("inert_clip", inert_at_zero_advantage=True)(ppo_clip)
    try:
        assert not zero_advantage_rows_inert(AlgorithmConfig(loss="plain_clip"))
        assert zero_advantage_rows_inert(AlgorithmConfig(loss="inert_clip"))
        assert zero_advantage_rows_inert(AlgorithmConfig(loss="dual_clip"))
        assert zero_advantage_rows_inert(
            AlgorithmConfig(aggregation="seq-mean-token-sum-norm", loss_scale_factor=8.0)
        )
        assert not zero_advantage_rows_inert(AlgorithmConfig(kl_coef=0.1))
    finally:
        unregister_loss("plain_clip")
        unregister_loss("inert_clip")
