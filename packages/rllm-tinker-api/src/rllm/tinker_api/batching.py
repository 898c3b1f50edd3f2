"""Cutting a train_step batch into mini-batches (one optimizer step each)."""

from __future__ import annotations

import random

import numpy as np


def split_mini_batches(size: int, count: int, seed: int | None) -> list[list[int]]:
    """``count`` nearly equal index groups (fewer when the batch is smaller)."""
    order = list(range(size))
    if seed is not None:
        random.Random(seed).shuffle(order)
    count = min(count, size)
    return [list(chunk) for chunk in np.array_split(np.array(order), count)]
