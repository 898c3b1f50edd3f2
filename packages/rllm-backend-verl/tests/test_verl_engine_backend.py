"""VerlBackend's train_step, weight versions and checkpoints over verl's real engine on the CPU.

``CPUCluster`` stands in for ``RayCluster`` (named as such, and only here): verl's
``TrainingWorker`` in this process instead of Ray worker groups, and no rollout servers, which
need GPUs. Everything the backend does with it (conversion, reference log-probs for KL, the
update with rllm.algos' loss, verl's FSDP checkpoint save and load) is real.
"""

from __future__ import annotations

from pathlib import Path

import pytest

# Named on its own in the workspace env (no verl there), the file skips; nox -s verl runs it.
pytest.importorskip("verl")

import torch
from verl_helpers import cpu_config, sequence

from rllm.algos import AlgorithmConfig
from rllm.backends.verl.actor import compute_log_probs
from rllm.backends.verl.backend import STATE_FILE, VerlBackend
from rllm.backends.verl.convert import to_data_proto
from rllm.backends.verl.loss import RllmPolicyLoss
from rllm.backends.verl.workers import local_training_worker

pytestmark = pytest.mark.verl

BATCH = [
    sequence([10, 11, 12, 13, 14], [0, 0, 1, 1, 1], 1.0, "a"),
    sequence([10, 11, 15, 16], [0, 0, 1, 1], -1.0, "a"),
    sequence([10, 12, 13, 17, 14], [0, 1, 1, 0, 1], 1.0, "b"),
    sequence([11, 12, 16], [0, 1, 1], -1.0, "b"),
]


class CPUCluster:
    """A stand-in for RayCluster on the CPU: in-process verl workers, no Ray, no rollout servers."""

    def __init__(self, config, algo: AlgorithmConfig) -> None:
        self.worker = local_training_worker(config)
        # The frozen reference: a second engine that is only ever asked for log-probs. (verl's
        # forward-only engine build places its FSDP2 params on the accelerator, so not that one.)
        self.ref = local_training_worker(config) if algo.kl_coef > 0 else None
        self.synced: list[int] = []
        self.set_loss(algo)

    def set_loss(self, algo: AlgorithmConfig) -> None:
        self.algo = algo
        self.worker.set_loss_fn(RllmPolicyLoss(algo))

    def inference_urls(self) -> list[str]:
        return []

    def actor(self):
        return self.worker

    def reference(self):
        return self.ref

    async def release_rollout_memory(self) -> None:
        """No rollout servers to put to sleep."""

    async def sync_weights(self, version: int) -> None:
        self.synced.append(version)

    def save_checkpoint(self, path: str, version: int) -> None:
        self.worker.save_checkpoint(local_path=path, global_step=version)

    def load_checkpoint(self, path: str) -> None:
        self.worker.load_checkpoint(local_path=path)

    def close(self) -> None:
        """Nothing to tear down."""


def _log_probs(backend: VerlBackend) -> torch.Tensor:
    return compute_log_probs(backend._cluster.worker, to_data_proto(BATCH, pad_token_id=0))["log_probs"]


async def test_train_sync_save_and_resume(tiny_model_path: Path, tmp_path: Path) -> None:
    algo = AlgorithmConfig(kl_coef=0.1, entropy_coef=0.01)
    backend = VerlBackend(cpu_config(tiny_model_path, optim={"lr": 1e-2}))
    backend._cluster = CPUCluster(backend.config, algo)
    first = await backend.train_step(BATCH, algo)
    assert {"actor/loss", "actor/kl", "actor/entropy", "grad_norm"} <= set(first)
    assert await backend.sync_weights() == 1
    saved = _log_probs(backend)
    await backend.save_checkpoint(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / STATE_FILE).is_file()

    await backend.train_step(BATCH, algo)
    assert await backend.sync_weights() == 2
    assert not torch.allclose(_log_probs(backend), saved)

    await backend.load_checkpoint(tmp_path / "ckpt")
    torch.testing.assert_close(_log_probs(backend), saved)
    assert await backend.sync_weights() == 2  # the restored version 1, then one new sync
    assert backend._cluster.synced == [1, 2, 2]
    await backend.close()


async def test_loading_something_else_fails_with_the_reason(tiny_model_path: Path, tmp_path: Path) -> None:
    backend = VerlBackend(cpu_config(tiny_model_path))
    backend._cluster = CPUCluster(backend.config, AlgorithmConfig())
    with pytest.raises(FileNotFoundError, match=STATE_FILE):
        await backend.load_checkpoint(tmp_path)
