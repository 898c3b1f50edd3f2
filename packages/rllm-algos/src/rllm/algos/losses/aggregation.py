"""Reduce a [batch, tokens] loss matrix to a scalar; masked tokens never count.

``num_tokens`` / ``num_sequences`` let a caller that splits one optimizer batch into
micro-batches divide by the whole batch's counts, so the summed gradient equals the gradient of
the full batch.
"""

from __future__ import annotations

import torch

from rllm.algos.config import AGGREGATIONS
from rllm.types.errors import InputError


def aggregate(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    *,
    loss_scale_factor: float | None = None,
    num_tokens: float | None = None,
    num_sequences: float | None = None,
) -> torch.Tensor:
    """Aggregate ``loss_mat`` over tokens where ``mask`` (bool) is set.

    token-mean: sum / trained tokens. token-sum: sum. seq-mean-token-sum: mean over sequences of
    each sequence's token sum. seq-mean-token-mean: mean over sequences of each sequence's token
    mean. seq-mean-token-sum-norm: seq-mean-token-sum / ``loss_scale_factor`` (default: the token
    width), Dr.GRPO's length-unbiased form. Sequences without a trained token are not counted.
    """
    weights = mask.to(loss_mat.dtype)
    masked = torch.where(mask, loss_mat, torch.zeros((), dtype=loss_mat.dtype, device=loss_mat.device))
    if mode == "token-mean":
        denom = weights.sum() if num_tokens is None else num_tokens
        return masked.sum() / denom
    if mode == "token-sum":
        return masked.sum()
    seq_tokens = weights.sum(dim=-1)
    has_tokens = seq_tokens > 0
    n_seq = has_tokens.sum().to(loss_mat.dtype) if num_sequences is None else num_sequences
    if mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm"):
        loss = masked.sum(dim=-1).sum() / n_seq
        if mode == "seq-mean-token-sum-norm":
            loss = loss / (loss_mat.shape[-1] if loss_scale_factor is None else loss_scale_factor)
        return loss
    if mode == "seq-mean-token-mean":
        per_seq = masked.sum(dim=-1) / seq_tokens.clamp(min=1.0)
        return per_seq.sum() / n_seq
    raise InputError(f"unknown aggregation {mode!r}; known: {list(AGGREGATIONS)}")


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over trained tokens (for metrics)."""
    return (
        torch.where(mask, values, torch.zeros((), dtype=values.dtype, device=values.device)).sum()
        / mask.sum()
    )
