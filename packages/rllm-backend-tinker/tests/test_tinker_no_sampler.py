"""``sampler_weights = "none"``: the local service trains without a sampler (`rllm sft`'s default).

Supervised training samples nothing, so the service starts no sampler engine, no HTTP server and
no second copy of the weights; its checkpoints are the same as a sampling service's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tinker_helpers import contrast_batch, cpu_params, start_backend

from rllm.algos.config import AlgorithmConfig
from rllm.backends.tinker import TinkerBackend
from rllm.types import ConfigError
from rllm.types.errors import StateError

SFT = AlgorithmConfig(loss="cross_entropy", tis="none")


async def test_trains_and_checkpoints_without_a_sampler(tiny_model_path: Path, tmp_path: Path) -> None:
    source = await start_backend(tiny_model_path, learning_rate=1e-2, sampler_weights="none")
    try:
        service = source.service
        assert service.engine is None and service.server is None  # nothing started to sample with
        with pytest.raises(StateError, match="without a sampler"):
            source.inference_urls()
        batch = contrast_batch(source)
        first = await source.train_step(batch, SFT)
        assert (await source.train_step(batch, SFT))["loss"] < first["loss"]
        assert "loss" in await source.eval_loss(batch)
        assert await source.sync_weights() == 1
        await source.save_checkpoint(tmp_path / "ckpt")
        expected = cpu_params(source.service.trainer.model)
    finally:
        await source.close()
    # A sampling service loads it as it loads any checkpoint: trainer and sampler get the weights.
    restored = await start_backend(tiny_model_path, learning_rate=1e-2)
    try:
        await restored.load_checkpoint(tmp_path / "ckpt")
        assert restored.service.engine.weight_version == 1
        for params in (cpu_params(restored.service.trainer.model), cpu_params(restored.service.engine.model)):
            assert all(torch.equal(params[name], value) for name, value in expected.items())
    finally:
        await restored.close()


def test_rl_without_a_sampler_is_refused_before_start(tiny_model_path: Path) -> None:
    backend = TinkerBackend({"model": str(tiny_model_path), "sampler_weights": "none"})
    backend.validate(SFT)
    with pytest.raises(ConfigError, match=r"backend\.options\.sampler_weights"):
        backend.validate(AlgorithmConfig())
