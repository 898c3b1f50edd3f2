"""The top-k distillation losses on the local trainer (``topk_forward_kl`` / ``topk_reverse_kl``):
the student's logprobs of the teacher's top-k tokens at every position, from the same forward
pass that gives its per-token logprobs, then rllm.algos' ``compute_topk_distill_loss``.

Padded and packed micro-batches give the same values: a packed pass gathers each sequence's
positions back to one sequence a row, the top-k included (see local/packing.py).
"""

from __future__ import annotations

import torch

from rllm.algos.config import AlgorithmConfig
from rllm.backends.tinker.local.batching import PaddedBatch
from rllm.types.errors import InputError


def student_topk_logprobs(
    model: torch.nn.Module, batch: PaddedBatch
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token logprobs of ``batch.targets`` [B, L-1], the student's logprobs of the teacher's
    top-k tokens [B, L-1, k] and its log mass outside them [B, L-1], all with gradient."""
    from rllm.algos.losses.distill import topk_and_tail

    ids = batch.teacher_ids
    if ids is None:
        raise InputError(
            "the top-k distillation loss got sequences without the teacher's top-k (TrainSequence."
            "teacher_topk); run it through `rllm distill` with distill.loss=topk"
        )
    packed = batch.packed
    if packed is None:
        logits = (
            model(
                input_ids=batch.input_ids,
                attention_mask=batch.attention_mask,
                use_cache=False,
                **batch.model_inputs,
            )
            .logits[:, :-1, :]
            .float()
        )
        top, tail = topk_and_tail(logits, ids)
        logprobs = logits.gather(-1, batch.targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, -1)
        return logprobs, top, tail
    logits = (
        model(
            input_ids=packed.input_ids,
            attention_mask=packed.attention_mask,
            position_ids=packed.position_ids,
            use_cache=False,
        )
        .logits[:, :-1, :]
        .float()
    )
    targets = packed.input_ids[:, 1:]
    logprobs = packed.gather(
        logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, -1)
    )
    # The teacher's ids laid out like the packed rows (0 on padding), then each sequence's
    # positions gathered back to one sequence a row.
    packed_ids = torch.zeros((*logits.shape[:2], ids.shape[-1]), dtype=ids.dtype, device=ids.device)
    packed_ids[packed.rows[packed.valid], packed.cols[packed.valid]] = ids[packed.valid]
    top, tail = topk_and_tail(logits, packed_ids)
    valid = packed.valid
    top = top[packed.rows, packed.cols]
    return logprobs, torch.where(valid.unsqueeze(-1), top, torch.zeros_like(top)), packed.gather(tail)


def topk_distill_loss(
    model: torch.nn.Module,
    batch: PaddedBatch,
    algo: AlgorithmConfig,
    num_tokens: float,
    num_sequences: float,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """(per-token logprobs, scalar loss, metrics) of one micro-batch under a top-k loss."""
    from rllm.algos.losses.distill import compute_topk_distill_loss

    logprobs, student, tail = student_topk_logprobs(model, batch)
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
