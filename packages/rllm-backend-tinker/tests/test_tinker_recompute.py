"""Gradient checkpointing (local/recompute.py) trains exactly as without it, LoRA and full weights,
on the trainer's thread only; and nothing a step allocates outlives it (a census of live tensors,
the reason a step's peak could grow from one step to the next)."""

from __future__ import annotations

import gc
import threading
import warnings
from collections import Counter
from pathlib import Path

import pytest
import torch

from rllm.algos.config import AlgorithmConfig
from rllm.backends.tinker.config import parse_config
from rllm.backends.tinker.local import recompute
from rllm.backends.tinker.local.model import load_policy
from rllm.backends.tinker.local.trainer import LocalTrainer
from rllm.types import FloatArray, TokenArray, TrainSequence


def trainer(path: Path, **options: object) -> LocalTrainer:
    config = parse_config(
        {"model": str(path), "dtype": "float32", "torch_threads": 2, "learning_rate": 1e-2, **options}
    )
    return LocalTrainer(
        load_policy(config, torch.device("cpu"), torch.float32), config, torch.device("cpu"), 0
    )


def batch(step: int = 0) -> list[TrainSequence]:
    out = []
    for i in range(6):
        n = 9 + (i * 5 + step) % 7
        out.append(
            TrainSequence(
                input_ids=TokenArray([(7 * i + 3 * j + step) % 20 + 1 for j in range(n)]),
                loss_mask=FloatArray([0.0] * 3 + [1.0] * (n - 3)),
                advantages=FloatArray([(-1.0) ** (i + step)] * n),
                sampler_logprobs=FloatArray([0.0] * 3 + [-2.0] * (n - 3)),
            )
        )
    return out


def layer_calls(model: torch.nn.Module) -> list[int]:
    """A counter of the first decoder layer's forward calls (a recomputation calls it again)."""
    layer = next(m for m in model.modules() if type(m).__name__.endswith("DecoderLayer"))
    calls = [0]
    layer.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


@pytest.mark.parametrize("options", [{"lora": {"rank": 4}}, {}], ids=["lora", "full"])
def test_checkpointing_trains_exactly_as_without(tiny_model_path: Path, options: dict[str, object]) -> None:
    algo = AlgorithmConfig(entropy_coef=0.01)  # the entropy's gradient is recomputed too
    plain = trainer(tiny_model_path, gradient_checkpointing=False, micro_batch_tokens=40, **options)
    checkpointed = trainer(tiny_model_path, gradient_checkpointing=True, micro_batch_tokens=40, **options)
    calls = layer_calls(checkpointed.model), layer_calls(plain.model)
    for step in range(2):
        want = plain.train_step(batch(step), algo)
        got = checkpointed.train_step(batch(step), algo)
        assert got["loss"] == pytest.approx(want["loss"], abs=1e-5)
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-5, abs=1e-6)
    assert calls[0][0] == 2 * calls[1][0] > 0  # every micro-batch's layers ran twice
    for a, b in zip(checkpointed.params, plain.params, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    # Training mode was never needed: dropout stays off, as the sampler has it.
    assert not checkpointed.model.training


def test_checkpointing_is_the_trainer_threads_alone(tiny_model_path: Path) -> None:
    """Another thread's forward pass with gradients (or a sampler's, without) keeps its
    activations while the trainer's thread recomputes."""
    model = trainer(tiny_model_path, gradient_checkpointing=True).model
    calls = layer_calls(model)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    started, finish = threading.Event(), threading.Event()

    def other() -> None:
        out = model(input_ids=ids, use_cache=False).logits.sum()
        started.set()
        finish.wait()
        out.backward()

    thread = threading.Thread(target=other)
    with recompute.recomputing(True):
        thread.start()
        started.wait()
        model(input_ids=ids, use_cache=False).logits.sum().backward()  # recomputed: two calls
        finish.set()
        thread.join()
    assert calls[0] == 3


def live_tensors(exclude: set[int]) -> Counter[tuple[tuple[int, ...], torch.dtype]]:
    gc.collect()
    found: Counter[tuple[tuple[int, ...], torch.dtype]] = Counter()
    for obj in every_tensor():
        if id(obj) not in exclude:
            found[(tuple(obj.shape), obj.dtype)] += 1
    return found


def every_tensor() -> list[torch.Tensor]:
    with warnings.catch_warnings():  # isinstance() on some lazy torch modules warns of deprecation
        warnings.simplefilter("ignore")
        return [obj for obj in gc.get_objects() if isinstance(obj, torch.Tensor)]


@pytest.mark.parametrize(
    "options", [{"lora": {"rank": 4}}, {"gradient_checkpointing": True}], ids=["lora", "full-ckpt"]
)
def test_no_tensor_outlives_a_step(tiny_model_path: Path, options: dict[str, object]) -> None:
    """After the first step (which allocates AdamW's moments) the live tensors are the same after
    every step: no cached activations, retained graphs or growing lists."""
    local = trainer(tiny_model_path, micro_batch_tokens=40, **options)
    algo = AlgorithmConfig(kl_coef=0.0)

    def kept() -> set[int]:
        ids = {id(p) for p in local.model.parameters()} | {id(b) for b in local.model.buffers()}
        for state in local.optimizer.state.values():
            ids |= {id(v) for v in state.values() if isinstance(v, torch.Tensor)}
        return ids

    def graphs() -> set[int]:
        gc.collect()
        return {id(o) for o in every_tensor() if o.grad_fn is not None}

    before = graphs()
    census = []
    for step in range(4):
        local.train_step(batch(step), algo)
        census.append(live_tensors(kept()))
    assert census[1] == census[2] == census[3]
    assert graphs() <= before  # no autograd graph survives a step
    assert all(p.grad is None for p in local.params)
