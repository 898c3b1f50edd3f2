"""From TrainSequences to padded tensors, mini-batches and micro-batches."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from rllm.backends.tinker.local.packing import PackLayout
from rllm.types import TrainSequence
from rllm.types.errors import InputError
from rllm.types.sequence import check_teacher_topk


@dataclass
class PaddedBatch:
    """Right-padded tensors. Per-token tensors are shifted: column j concerns token j+1, the one the
    model predicts from tokens[:j+1]; token 0 is never predicted and never trained."""

    input_ids: torch.Tensor  # [B, L] long
    attention_mask: torch.Tensor  # [B, L] long
    targets: torch.Tensor  # [B, L-1] long
    mask: torch.Tensor  # [B, L-1] float
    advantages: torch.Tensor  # [B, L-1] float
    sampler_logprobs: torch.Tensor  # [B, L-1] float
    indices: list[int]  # positions of these sequences in the train_step batch
    # A vision-language model's pixel inputs (pixel_values, image_grid_thw, mm_token_type_ids).
    model_inputs: dict[str, torch.Tensor] = field(default_factory=dict)
    # Set when the forward pass runs on packed rows (``pack_tokens``); the tensors above stay
    # one sequence a row, so the loss sees the same layout either way.
    packed: PackLayout | None = None
    # A distillation teacher's top-k per position (``TrainSequence.teacher_topk``), shifted like
    # the rest: [B, L-1, k] token ids and their teacher logprobs; None when no sequence has one.
    teacher_ids: torch.Tensor | None = None
    teacher_logprobs: torch.Tensor | None = None

    @property
    def num_tokens(self) -> float:
        return float(self.mask.sum())


def check_sequences(batch: list[TrainSequence], vocab_size: int) -> None:
    """Clear errors for malformed sequences, naming the sequence and the field. (Non-finite
    values at trained tokens are caught by rllm.algos' loss checks, with their position.)"""
    if not batch:
        raise InputError("train_step got an empty batch")
    for i, seq in enumerate(batch):
        n = len(seq.input_ids)
        if n < 2:
            raise InputError(f"batch[{i}]: a sequence needs at least 2 tokens to train on, got {n}")
        for name in ("loss_mask", "advantages", "sampler_logprobs"):
            if len(getattr(seq, name)) != n:
                raise InputError(f"batch[{i}].{name} has {len(getattr(seq, name))} values for {n} tokens")
        tokens = np.frombuffer(seq.input_ids, dtype=np.int32)
        if tokens.min() < 0 or tokens.max() >= vocab_size:
            raise InputError(f"batch[{i}].input_ids has ids outside the vocabulary [0, {vocab_size})")
        if seq.teacher_topk is not None:
            topk = check_teacher_topk(seq, f"batch[{i}]")
            ids = np.frombuffer(topk.ids, dtype=np.int32)
            if ids.min() < 0 or ids.max() >= vocab_size:
                raise InputError(
                    f"batch[{i}].teacher_topk.ids has ids outside the vocabulary [0, {vocab_size})"
                )


def split_inert_rows(batch: list[TrainSequence], indices: list[int]) -> tuple[list[int], float, float]:
    """(the rows to compute, the trained tokens and the sequences left out) where every row whose
    advantages are 0 at all its trained tokens is left out. The counts are those a PaddedBatch of
    the left-out rows would give (``num_tokens``, sequences with a trained token)."""
    rows: list[int] = []
    tokens, sequences = 0.0, 0.0
    for i in indices:
        mask = np.frombuffer(batch[i].loss_mask, dtype=np.float32)[1:]
        trained = mask != 0
        if np.any(np.frombuffer(batch[i].advantages, dtype=np.float32)[1:][trained] != 0):
            rows.append(i)
            continue
        tokens += float(mask.sum())
        sequences += float(mask.sum() > 0)
    return rows, tokens, sequences


def split_micro_batches(batch: list[TrainSequence], indices: list[int], max_tokens: int) -> list[list[int]]:
    """Cut a mini-batch so each piece's padded size (rows x longest) stays under ``max_tokens``."""
    if max_tokens <= 0:
        return [indices]
    pieces: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in indices:
        n = len(batch[i].input_ids)
        if current and (len(current) + 1) * max(longest, n) > max_tokens:
            pieces.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, n)
    if current:
        pieces.append(current)
    return pieces


def pad(batch: list[TrainSequence], indices: list[int], pad_id: int, device: torch.device) -> PaddedBatch:
    seqs = [batch[i] for i in indices]
    width = max(len(s.input_ids) for s in seqs)
    ids = np.full((len(seqs), width), pad_id, dtype=np.int64)
    attention = np.zeros((len(seqs), width), dtype=np.int64)
    mask = np.zeros((len(seqs), width), dtype=np.float32)
    adv = np.zeros((len(seqs), width), dtype=np.float32)
    slp = np.zeros((len(seqs), width), dtype=np.float32)
    for row, s in enumerate(seqs):
        n = len(s.input_ids)
        ids[row, :n] = np.frombuffer(s.input_ids, dtype=np.int32)
        attention[row, :n] = 1
        mask[row, :n] = np.frombuffer(s.loss_mask, dtype=np.float32)
        adv[row, :n] = np.frombuffer(s.advantages, dtype=np.float32)
        slp[row, :n] = np.frombuffer(s.sampler_logprobs, dtype=np.float32)
    input_ids = torch.from_numpy(ids).to(device)
    teacher = teacher_topk_tensors(batch, indices, width, device)
    return PaddedBatch(
        input_ids=input_ids,
        attention_mask=torch.from_numpy(attention).to(device),
        targets=input_ids[:, 1:],
        mask=torch.from_numpy(mask[:, 1:]).to(device),
        advantages=torch.from_numpy(adv[:, 1:]).to(device),
        sampler_logprobs=torch.from_numpy(slp[:, 1:]).to(device),
        indices=list(indices),
        teacher_ids=None if teacher is None else teacher[0],
        teacher_logprobs=None if teacher is None else teacher[1],
    )


def teacher_topk_tensors(
    batch: list[TrainSequence], indices: list[int], width: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The sequences' teacher top-k as shifted [B, width-1, k] ids and logprobs (zeros past each
    end); None when none has one. All or none must, with one ``k``: InputError naming the first
    that differs (a batch half scored by the teacher cannot train on one loss)."""
    seqs = [batch[i] for i in indices]
    if all(s.teacher_topk is None for s in seqs):
        return None
    k = next(s.teacher_topk.k for s in seqs if s.teacher_topk is not None)
    ids = np.zeros((len(seqs), width, k), dtype=np.int64)
    logprobs = np.zeros((len(seqs), width, k), dtype=np.float32)
    for row, (i, s) in enumerate(zip(indices, seqs, strict=True)):
        topk = s.teacher_topk
        if topk is None or topk.k != k:
            got = "none" if topk is None else f"k={topk.k}"
            raise InputError(f"batch[{i}].teacher_topk: {got}, where other sequences of the batch have k={k}")
        n = len(s.input_ids)
        ids[row, :n] = np.frombuffer(topk.ids, dtype=np.int32).reshape(n, k)
        logprobs[row, :n] = np.frombuffer(topk.logprobs, dtype=np.float32).reshape(n, k)
    return (
        torch.from_numpy(ids[:, 1:]).to(device),
        torch.from_numpy(logprobs[:, 1:]).to(device),
    )
