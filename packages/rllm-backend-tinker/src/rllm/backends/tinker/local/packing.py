"""Sequence packing: several sequences share one row of the forward pass, attention kept inside each.

Short sequences padded to the longest waste most of a padded batch's compute. With
``pack_tokens > 0`` the local trainer lays sequences end to end in rows of at most that many
tokens (first-fit decreasing; a longer sequence gets a row of its own). Each sequence keeps its
own positions (``position_ids`` restart at 0) and sees only itself: the attention mask is
block-diagonal and causal. The per-token logprobs are then gathered back into the one-sequence-a-row
layout of :class:`~rllm.backends.tinker.local.batching.PaddedBatch`, so the loss, its aggregation and
every recorded logprob are computed exactly as without packing (the gather carries the gradient).

(verl does the same with flash-attention's varlen kernels: it removes padding and passes
``cu_seqlens``, so no mask is built; here the mask is explicit because the local trainer runs on
CPU and with ``sdpa``/``eager`` attention, where no varlen kernel exists.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from rllm.types import TrainSequence
from rllm.types.errors import InputError

# Attention implementations that take an explicit 4-D mask (a bool one for sdpa, additive for eager).
PACKABLE_ATTENTION = ("sdpa", "eager")


@dataclass
class PackLayout:
    """The packed forward pass of a micro-batch and where each sequence's tokens landed."""

    input_ids: torch.Tensor  # [R, W] long
    position_ids: torch.Tensor  # [R, W] long, restarting at 0 for each sequence
    attention_mask: torch.Tensor  # [R, 1, W, W]: bool (True = attend) or additive float
    rows: torch.Tensor  # [S, L-1] long: the packed row of each sequence's shifted column
    cols: torch.Tensor  # [S, L-1] long: the packed column of the logits that predict it
    valid: torch.Tensor  # [S, L-1] bool: False past a sequence's end

    def gather(self, packed: torch.Tensor) -> torch.Tensor:
        """[R, W-1] per-position values -> [S, L-1] per-sequence values (0 past each end)."""
        picked = packed[self.rows, self.cols]
        return torch.where(self.valid, picked, torch.zeros_like(picked))


def plan_rows(lengths: dict[int, int], indices: list[int], pack_tokens: int) -> list[list[int]]:
    """Sequence indices grouped into rows of at most ``pack_tokens`` tokens (first-fit decreasing,
    ties kept in batch order, so the plan is a pure function of the lengths)."""
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(indices, key=lambda i: -lengths[i]):
        n = lengths[i]
        for r, free in enumerate(room):
            if n <= free:
                rows[r].append(i)
                room[r] -= n
                break
        else:
            rows.append([i])
            room.append(pack_tokens - n)  # negative for a sequence longer than a row: it fills it
    return rows


def plan_packed_micro_batches(
    batch: list[TrainSequence], indices: list[int], pack_tokens: int, micro_batch_tokens: int
) -> list[list[list[int]]]:
    """Micro-batches of packed rows; each keeps rows x its longest row under ``micro_batch_tokens``
    (0: one micro-batch)."""
    lengths = {i: len(batch[i].input_ids) for i in indices}
    rows = plan_rows(lengths, indices, pack_tokens)
    if micro_batch_tokens <= 0:
        return [rows]
    pieces: list[list[list[int]]] = []
    current: list[list[int]] = []
    widest = 0
    for row in rows:
        width = sum(lengths[i] for i in row)
        if current and (len(current) + 1) * max(widest, width) > micro_batch_tokens:
            pieces.append(current)
            current, widest = [], 0
        current.append(row)
        widest = max(widest, width)
    if current:
        pieces.append(current)
    return pieces


def pack_layout(
    batch: list[TrainSequence],
    rows: list[list[int]],
    pad_id: int,
    device: torch.device,
    attention: str,
    dtype: torch.dtype,
) -> PackLayout:
    """The packed tensors of ``rows`` (sequence indices); sequences are numbered in row order."""
    if attention not in PACKABLE_ATTENTION:
        raise InputError(
            f"pack_tokens needs the model's attention to be one of {PACKABLE_ATTENTION} (it takes a "
            f"block-diagonal mask), but the model uses {attention!r}; set pack_tokens=0"
        )
    order = [i for row in rows for i in row]
    if any(batch[i].images for i in order):
        raise InputError("pack_tokens cannot pack sequences with images; set pack_tokens=0")
    width = max(sum(len(batch[i].input_ids) for i in row) for row in rows)
    longest = max(len(batch[i].input_ids) for i in order)
    ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    positions = np.zeros((len(rows), width), dtype=np.int64)
    segments = np.full((len(rows), width), -1, dtype=np.int64)  # padding: its own segment
    row_of = np.zeros((len(order), longest - 1), dtype=np.int64)
    col_of = np.zeros((len(order), longest - 1), dtype=np.int64)
    valid = np.zeros((len(order), longest - 1), dtype=bool)
    s = 0
    for r, row in enumerate(rows):
        offset = 0
        for i in row:
            n = len(batch[i].input_ids)
            ids[r, offset : offset + n] = np.frombuffer(batch[i].input_ids, dtype=np.int32)
            positions[r, offset : offset + n] = np.arange(n)
            segments[r, offset : offset + n] = s
            # column j of the sequence (token j+1) is predicted by the logits at offset + j
            row_of[s, : n - 1] = r
            col_of[s, : n - 1] = np.arange(offset, offset + n - 1)
            valid[s, : n - 1] = True
            offset += n
            s += 1
    seg = torch.from_numpy(segments).to(device)
    causal = torch.ones((width, width), dtype=torch.bool, device=device).tril()
    allowed = (seg[:, :, None] == seg[:, None, :]) & causal  # padding attends to padding: no empty row
    if attention == "eager":  # eager adds the mask to the scores
        mask = torch.zeros(allowed.shape, dtype=dtype, device=device)
        mask = mask.masked_fill(~allowed, torch.finfo(dtype).min)
    else:
        mask = allowed
    return PackLayout(
        input_ids=torch.from_numpy(ids).to(device),
        position_ids=torch.from_numpy(positions).to(device),
        attention_mask=mask[:, None, :, :],
        rows=torch.from_numpy(row_of).to(device),
        cols=torch.from_numpy(col_of).to(device),
        valid=torch.from_numpy(valid).to(device),
    )
