"""The top-k distillation losses on the local trainer (``topk_forward_kl`` / ``topk_reverse_kl``):
the student's logprobs of the teacher's top-k tokens at every position, from the same forward
pass that gives its per-token logprobs, then rllm.algos' ``compute_topk_distill_loss``.

Padded and packed micro-batches give the same values: the logits are taken (local/logprobs.py)
only at each sequence's trained positions, wherever a packed row holds them (local/packing.py).
"""

from __future__ import annotations

import torch

from rllm.algos.config import AlgorithmConfig
from rllm.backends.tinker.local.batching import PaddedBatch
from rllm.backends.tinker.local.logprobs import LogitHead, token_stats
from rllm.types.errors import InputError


def student_topk_logprobs(
    model: torch.nn.Module, head: LogitHead, batch: PaddedBatch, *, chunk: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token logprobs of ``batch.targets`` [B, L-1], the student's logprobs of the teacher's
    top-k tokens [B, L-1, k] and its log mass outside them [B, L-1], all with gradient, at the
    trained positions (0 elsewhere), the logits taken ``chunk`` positions at a time."""
    ids = batch.teacher_ids
    if ids is None:
        raise InputError(
            "the top-k distillation loss got sequences without the teacher's top-k (TrainSequence."
            "teacher_topk); run it through `rllm distill` with distill.loss=topk"
        )
    stats = token_stats(model, head, batch, chunk=chunk, teacher_ids=ids)
    assert stats.topk is not None and stats.tail is not None  # asked for with teacher_ids
    return stats.logprobs, stats.topk, stats.tail


def topk_distill_loss(
    model: torch.nn.Module,
    head: LogitHead,
    batch: PaddedBatch,
    algo: AlgorithmConfig,
    num_tokens: float,
    num_sequences: float,
    *,
    chunk: int,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """(per-token logprobs, scalar loss, metrics) of one micro-batch under a top-k loss."""
    from rllm.algos.losses.distill import compute_topk_distill_loss

    logprobs, student, tail = student_topk_logprobs(model, head, batch, chunk=chunk)
    assert batch.teacher_logprobs is not None  # set with teacher_ids (batching.teacher_topk_tensors)
    loss, metrics = compute_topk_distill_loss(
        student,
        batch.teacher_logprobs,
        batch.mask,
        algo,
        student_tail=tail,
        num_tokens=num_tokens,
        num_sequences=num_sequences,
    )
    return logprobs, loss, metrics


__all__ = ["student_topk_logprobs", "topk_distill_loss"]
