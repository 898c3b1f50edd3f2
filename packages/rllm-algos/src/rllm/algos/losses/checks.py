"""Input checks for the losses: wrong shapes, NaN/inf at trained tokens and empty batches fail
loudly here, naming the tensor and position, instead of surfacing later as a NaN loss."""

from __future__ import annotations

from typing import overload

import torch

from rllm.algos.errors import AlgorithmInputError


class LossInputError(AlgorithmInputError):
    """A tensor given to a loss has the wrong shape or dtype, or non-finite values at trained tokens."""


def check_mask(mask: torch.Tensor) -> torch.Tensor:
    """Validate the [batch, tokens] mask (1 = trained token) and return it as bool."""
    if not isinstance(mask, torch.Tensor):
        raise LossInputError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dim() != 2:
        raise LossInputError(f"mask must be [batch, tokens], got shape {tuple(mask.shape)}")
    if mask.numel() == 0:
        raise LossInputError(f"empty batch: mask has shape {tuple(mask.shape)}")
    if mask.dtype != torch.bool:
        if not ((mask == 0) | (mask == 1)).all():
            raise LossInputError("mask must hold only 0 and 1 (1 = trained token)")
        mask = mask != 0
    if not mask.any():
        raise LossInputError("empty batch: the mask selects no trained token")
    return mask


@overload
def check_tokens(
    name: str, values: torch.Tensor, mask: torch.Tensor, *, required: bool = True
) -> torch.Tensor: ...
@overload
def check_tokens(
    name: str, values: torch.Tensor | None, mask: torch.Tensor, *, required: bool = True
) -> torch.Tensor | None: ...
def check_tokens(
    name: str, values: torch.Tensor | None, mask: torch.Tensor, *, required: bool = True
) -> torch.Tensor | None:
    """Validate a [batch, tokens] float tensor aligned with ``mask``; finite where ``mask`` is set.

    Returns it with masked positions replaced by 0, so padding (even NaN padding) can neither
    reach the loss value nor its gradient.
    """
    if values is None:
        if required:
            raise LossInputError(f"`{name}` is required for this loss configuration")
        return None
    if not isinstance(values, torch.Tensor):
        raise LossInputError(f"`{name}` must be a torch.Tensor, got {type(values).__name__}")
    if tuple(values.shape) != tuple(mask.shape):
        raise LossInputError(
            f"`{name}` has shape {tuple(values.shape)}, expected {tuple(mask.shape)} like the mask"
        )
    if not values.is_floating_point():
        raise LossInputError(f"`{name}` must be a floating-point tensor, got {values.dtype}")
    bad = ~torch.isfinite(values.detach()) & mask
    if bad.any():
        row, col = (int(v) for v in bad.nonzero()[0])
        raise LossInputError(
            f"`{name}` is {values[row, col].item()} at trained token [{row}, {col}] "
            f"({int(bad.sum())} non-finite trained values in all)"
        )
    return torch.where(mask, values, torch.zeros((), dtype=values.dtype, device=values.device))


def check_advantages(
    advantages: torch.Tensor | None, mask: torch.Tensor, *, required: bool
) -> torch.Tensor | None:
    """Advantages may be [batch, tokens] or one per sequence [batch] (broadcast over tokens)."""
    if advantages is None:
        if required:
            raise LossInputError("`advantages` is required for this loss")
        return None
    if isinstance(advantages, torch.Tensor) and advantages.dim() == 1:
        if advantages.shape[0] != mask.shape[0]:
            raise LossInputError(
                f"`advantages` has {advantages.shape[0]} entries, expected one per sequence ({mask.shape[0]})"
            )
        advantages = advantages.unsqueeze(-1).expand(mask.shape)
    return check_tokens("advantages", advantages, mask)
