"""Builders shared by the verl backend's tests: TrainSequences, a padded reference forward, and
an in-process stand-in for the Ray cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from rllm.types import FloatArray, TokenArray, TrainSequence


def sequence(
    tokens: list[int],
    mask: list[int],
    advantage: float,
    group: str = "g",
    *,
    logprob: float = -1.0,
    **metadata: object,
) -> TrainSequence:
    """A sequence whose sampled tokens (mask 1) carry ``advantage`` and sampler log-prob ``logprob``."""
    return TrainSequence(
        input_ids=TokenArray(tokens),
        loss_mask=FloatArray([float(m) for m in mask]),
        advantages=FloatArray([advantage * m for m in mask]),
        sampler_logprobs=FloatArray([logprob * m for m in mask]),
        group_id=group,
        metadata=dict(metadata),
    )


def reference_log_probs(
    model: torch.nn.Module, batch: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and entropies of the response tokens from a plain transformers forward, [B, R]."""
    logits = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
    ).logits.float()
    width = batch["responses"].shape[1]
    # token t is predicted from position t - 1
    shifted = logits[:, -width - 1 : -1, :]
    log_softmax = torch.log_softmax(shifted, dim=-1)
    log_probs = log_softmax.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)
    entropy = -(log_softmax.exp() * log_softmax).sum(-1)
    return log_probs, entropy


def cpu_config(model: Path, **options: object):
    """A one-rank CPU config for verl's engine (micro-batches of 2, so a batch of 4 splits)."""
    from rllm.backends.verl.config import parse_config

    base = {
        "model": str(model),
        "cluster": {"device": "cpu"},
        "gradient_checkpointing": False,
        "micro_batch_size_per_gpu": 2,
        "log_prob_micro_batch_size_per_gpu": 2,
    }
    return parse_config({**base, **options})


class LocalCluster:
    """The parts of ``RayCluster`` that ``VerlBackend``'s train_step and checkpoints use, over one
    in-process ``TrainingWorker`` (verl's FSDP2 engine, one rank on the CPU): no Ray, no rollout."""

    def __init__(self, worker: Any, algo: Any) -> None:
        self.worker = worker
        self.set_loss(algo)

    def set_loss(self, algo: Any) -> None:
        from rllm.backends.verl.loss import RllmPolicyLoss

        self.algo = algo
        self.worker.set_loss_fn(RllmPolicyLoss(algo))

    def actor(self) -> Any:
        return self.worker

    def reference(self) -> None:
        return None

    async def release_rollout_memory(self) -> None:
        return None

    def learning_rate(self) -> float:
        from rllm.backends.verl.sft import engine_lr

        return engine_lr(self.worker.engine)

    def save_checkpoint(self, path: str, version: int) -> None:
        self.worker.save_checkpoint(local_path=path, global_step=version)

    def load_checkpoint(self, path: str) -> None:
        self.worker.load_checkpoint(local_path=path)
