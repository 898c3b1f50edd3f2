"""Supervised training on verl without a sampler (``rollout.engine = "none"``).

``rllm sft`` only trains: it never asks for inference URLs or syncs weights. With
``backend.options.rollout.engine = "none"`` the backend starts no vLLM/SGLang replica, no
external server and no weight sync: on GPUs (or several CPU ranks, or a Ray address) verl's
worker group in the ``actor`` role alone (ray_cluster.py); on one CPU rank, verl's
``TrainingWorker`` in this process (:class:`LocalTrainer`), without Ray, whose start-up would be
most of a small run. The loss is rllm.algos' ``cross_entropy`` inside verl's engine, over the
assistant tokens' loss mask, and the checkpoints are the usual verl ones (``rllm export``,
``rllm train --init-from``). Anything that needs a sampler is refused with the key to change.

The SFT extras (``rllm.engine.data.sft``): the held-out loss is a forward-only pass of the same
workers (``actor.held_out_loss``); the LR schedule with warmup sets each step's LR on the
engine's optimizer before the update (:func:`set_engine_lr`), the same ``lr_scale`` as the local
backend. verl's own scheduler is not used for it: it has no linear schedule, and it steps after
the update, where its LR is overwritten before the next step.
"""

from __future__ import annotations

from typing import Any

from rllm.algos.config import AlgorithmConfig
from rllm.algos.registry import get_loss
from rllm.backends.verl.config import NO_ROLLOUT, VerlBackendConfig
from rllm.types.errors import ConfigError

ENGINE_KEY = "backend.options.rollout.engine"
NEEDS_A_SAMPLER = (
    f"{ENGINE_KEY} = 'none' starts no sampler, so it runs supervised training (`rllm sft`) only; "
    "RL and distillation sample: set it to 'vllm', 'sglang' or 'external'"
)


def check_no_rollout(algo: AlgorithmConfig) -> None:
    """Before anything starts: without a sampler only a supervised loss without KL can train."""
    if not get_loss(algo.loss).supervised:
        raise ConfigError(f"loss {algo.loss!r}: {NEEDS_A_SAMPLER}", ENGINE_KEY)
    if algo.kl_coef > 0:
        # The reference policy lives in verl's actor_rollout_ref role, which builds a rollout.
        raise ConfigError(f"kl_coef > 0 needs the reference policy's workers: {NEEDS_A_SAMPLER}", ENGINE_KEY)


def no_sampler() -> ConfigError:
    """What asking a sampler-less backend for its servers raises (after start: RL with cross_entropy)."""
    return ConfigError(NEEDS_A_SAMPLER, ENGINE_KEY)


def runs_in_process(config: VerlBackendConfig) -> bool:
    """No sampler, one CPU rank, no Ray cluster named: the trainer runs in this process."""
    c = config.cluster
    return (
        config.rollout.engine == NO_ROLLOUT
        and c.device == "cpu"
        and config.world_size == 1
        and not c.ray_address
    )


def engine_lr(engine: Any) -> float:
    """The LR the engine's optimizer steps with next (its first parameter group's)."""
    return float(engine.optimizer.param_groups[0]["lr"])


def set_engine_lr(engine: Any, lr: float) -> float:
    """Every parameter group of the engine's optimizer at ``lr``, for the next update."""
    for group in engine.optimizer.param_groups:
        group["lr"] = lr
    return lr


class LocalTrainer:
    """What ``VerlBackend`` asks of its cluster, over one in-process ``TrainingWorker`` (verl's
    FSDP2 engine, rank 0 of 1 on the CPU); there is nothing to sample from."""

    def __init__(self, config: VerlBackendConfig, algo: AlgorithmConfig) -> None:
        from rllm.backends.verl.workers import local_training_worker

        self.worker: Any = local_training_worker(config)
        self.set_loss(algo)

    def set_loss(self, algo: AlgorithmConfig) -> None:
        from rllm.backends.verl.loss import RllmPolicyLoss

        self.algo = algo
        self.worker.set_loss_fn(RllmPolicyLoss(algo))

    def actor(self) -> Any:
        return self.worker

    def reference(self) -> None:
        return None  # check_no_rollout refused kl_coef > 0

    async def release_rollout_memory(self) -> None:
        return None

    def set_learning_rate(self, lr: float) -> float:
        return set_engine_lr(self.worker.engine, lr)

    def learning_rate(self) -> float:
        return engine_lr(self.worker.engine)

    def inference_urls(self) -> list[str]:
        raise no_sampler()

    async def sync_weights(self, version: int) -> None:
        raise no_sampler()

    def save_checkpoint(self, path: str, version: int) -> None:
        # The same files as the Ray workers' save_checkpoint (which calls this engine's).
        self.worker.save_checkpoint(local_path=path, global_step=version)

    def load_checkpoint(self, path: str) -> None:
        self.worker.load_checkpoint(local_path=path)

    def close(self) -> None:
        self.worker = None


__all__ = [
    "ENGINE_KEY",
    "NEEDS_A_SAMPLER",
    "LocalTrainer",
    "check_no_rollout",
    "engine_lr",
    "no_sampler",
    "runs_in_process",
    "set_engine_lr",
]
