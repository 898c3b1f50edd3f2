"""TrainSequences → verl ``DataProto``: the batch layout verl's actor and ref workers read.

verl splits every row into a left-padded prompt and a right-padded response. A TrainSequence is
one token stream whose ``loss_mask`` marks the sampled tokens; its "prompt" is everything before
the first sampled token and its "response" everything from there on, so the tool outputs and
observations of later turns sit inside the response with ``response_mask`` 0 (verl's multi-turn
layout). Position ids count real tokens only (padding gets 0), as verl's own rollouts write them.

The way back: :func:`record_trainer_logprobs` writes verl's per-response-token log-probs of a
batch (``old_log_probs``, [B, R]) onto each sequence's ``trainer_logprobs`` at the token positions
the row came from, so the engine measures the train/sampler mismatch as on every backend.

Vision-language models (``vision``, from :func:`rllm.backends.verl.vision.vision_rows_for`):
each sequence's ``images`` become its row's ``multi_modal_inputs`` and, for M-RoPE models
(Qwen2-VL, Qwen2.5-VL), its position ids become [4, seq] (text positions, then the temporal,
height and width indices), the layout verl 0.9.1's Qwen-VL path reads (``rllm.backends.verl.vision``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from rllm.types import FloatArray, TrainSequence
from rllm.types.errors import RLLMError
from verl import DataProto

if TYPE_CHECKING:
    from rllm.backends.verl.vision import VisionRows

MULTI_MODAL_KEY = "multi_modal_inputs"  # non_tensor_batch: one dict of processor tensors per row


class BatchConversionError(RLLMError, ValueError):
    """A TrainSequence cannot be laid out as a verl row; the message names the sequence."""


def to_data_proto(
    batch: Sequence[TrainSequence], *, pad_token_id: int, vision: VisionRows | None = None
) -> DataProto:
    """One DataProto row per sequence with every field verl's PPO actor needs.

    Tensors: prompts, responses, input_ids, attention_mask, position_ids, response_mask,
    advantages, rollout_log_probs. Non-tensors: uid (the group id), trajectory_id, role, and
    ``multi_modal_inputs`` (one dict per row, {} for a row without images) when ``vision`` is
    given. A sequence with images needs ``vision``: without it the images would be dropped.
    """
    if not batch:
        raise BatchConversionError("cannot convert an empty batch")
    if vision is None:
        with_images = next((i for i, seq in enumerate(batch) if seq.images), None)
        if with_images is not None:
            raise BatchConversionError(
                f"sequence {with_images} (group {batch[with_images].group_id!r}) has images, but the "
                "model takes no image inputs (a text-only model, or no vision rows were given)"
            )
    splits = [_prompt_length(seq, index) for index, seq in enumerate(batch)]
    prompt_width = max(splits)
    response_width = max(len(seq.input_ids) - split for seq, split in zip(batch, splits, strict=True))
    size = len(batch)
    prompts = torch.full((size, prompt_width), pad_token_id, dtype=torch.int64)
    responses = torch.full((size, response_width), pad_token_id, dtype=torch.int64)
    attention = torch.zeros((size, prompt_width + response_width), dtype=torch.int64)
    response_mask = torch.zeros((size, response_width), dtype=torch.int64)
    advantages = torch.zeros((size, response_width), dtype=torch.float32)
    rollout_log_probs = torch.zeros((size, response_width), dtype=torch.float32)
    position_rows: list[torch.Tensor] = []
    multi_modal: list[dict[str, torch.Tensor]] = []
    for row, (seq, split) in enumerate(zip(batch, splits, strict=True)):
        tokens = torch.tensor(list(seq.input_ids), dtype=torch.int64)
        n_response = len(tokens) - split
        prompts[row, prompt_width - split :] = tokens[:split]
        responses[row, :n_response] = tokens[split:]
        attention[row, prompt_width - split : prompt_width + n_response] = 1
        response_mask[row, :n_response] = torch.tensor(list(seq.loss_mask[split:])).to(torch.int64)
        advantages[row, :n_response] = torch.tensor(list(seq.advantages[split:]))
        rollout_log_probs[row, :n_response] = torch.tensor(list(seq.sampler_logprobs[split:]))
        positions = torch.arange(len(tokens), dtype=torch.int64)[None, :]
        if vision is not None:
            inputs, positions = _vision_row(vision, seq, row)
            multi_modal.append(inputs)
        position_rows.append(_placed(positions, split, prompt_width, response_width))
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention,
        "position_ids": _stack_positions(position_rows),
        "response_mask": response_mask,
        "advantages": advantages,
        "rollout_log_probs": rollout_log_probs,
    }
    non_tensors = _non_tensors(batch)
    if vision is not None:
        non_tensors[MULTI_MODAL_KEY] = _column(multi_modal)
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)


def record_trainer_logprobs(batch: Sequence[TrainSequence], log_probs: torch.Tensor) -> None:
    """Write the rows' response log-probs ([B, >= R], as ``to_data_proto(batch)`` laid the rows out)
    onto each sequence's ``trainer_logprobs``: aligned with ``input_ids``, 0 outside sampled tokens."""
    if log_probs.ndim != 2 or log_probs.shape[0] != len(batch):
        raise BatchConversionError(
            f"log-probs of shape {tuple(log_probs.shape)} do not match a batch of {len(batch)} sequences"
        )
    rows = log_probs.detach().float().cpu().numpy()
    for row, seq in enumerate(batch):
        split = _prompt_length(seq, row)
        n = len(seq.input_ids)
        if n - split > rows.shape[1]:
            raise BatchConversionError(
                f"sequence {row} (group {seq.group_id!r}): {n - split} response tokens, but the "
                f"log-probs have {rows.shape[1]} columns"
            )
        values = np.zeros(n, dtype=np.float32)
        values[split:] = rows[row, : n - split]  # response column j is token split + j
        values *= np.frombuffer(seq.loss_mask, dtype=np.float32) > 0
        seq.trainer_logprobs = FloatArray(values.tobytes())


def _vision_row(
    vision: VisionRows, seq: TrainSequence, row: int
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    from rllm.backends.verl.vision import VisionRowError

    try:
        return vision.row(seq, row)
    except VisionRowError as exc:
        raise BatchConversionError(f"{exc} (group {seq.group_id!r})") from None


def _prompt_length(seq: TrainSequence, index: int) -> int:
    """Tokens before the first sampled token (verl's prompt); validates the sequence on the way."""
    n = len(seq.input_ids)
    where = f"sequence {index} (group {seq.group_id!r})"
    for name in ("loss_mask", "advantages", "sampler_logprobs"):
        if len(getattr(seq, name)) != n:
            raise BatchConversionError(f"{where}: {name} has {len(getattr(seq, name))} values for {n} tokens")
    if n < 2:
        raise BatchConversionError(f"{where}: needs at least 2 tokens (a prompt and a response), got {n}")
    if any(value not in (0.0, 1.0) for value in seq.loss_mask):
        raise BatchConversionError(f"{where}: loss_mask must hold only 0 and 1")
    first = next((i for i, value in enumerate(seq.loss_mask) if value), None)
    if first == 0:
        raise BatchConversionError(
            f"{where}: its first token is trained, but a token needs context to be predicted"
        )
    # A sequence with no sampled token still has to form a row: its last token becomes a masked response.
    return n - 1 if first is None else first


def _placed(ids: torch.Tensor, split: int, prompt_width: int, response_width: int) -> torch.Tensor:
    """A sequence's [channels, n] position ids at its place in the left/right-padded row."""
    n = ids.shape[1]
    out = torch.zeros((ids.shape[0], prompt_width + response_width), dtype=torch.int64)
    out[:, prompt_width - split : prompt_width + n - split] = ids
    return out


def _stack_positions(rows: list[torch.Tensor]) -> torch.Tensor:
    channels = {row.shape[0] for row in rows}
    if len(channels) != 1:
        raise BatchConversionError(f"position ids mix channel counts {sorted(channels)} in one batch")
    stacked = torch.stack(rows)
    return stacked[:, 0, :] if channels == {1} else stacked  # [B, T], or [B, C, T] for mrope


def _column(values: list[Any]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def _non_tensors(batch: Sequence[TrainSequence]) -> dict[str, np.ndarray]:
    return {
        "uid": _column([seq.group_id for seq in batch]),
        "trajectory_id": _column([str(seq.metadata.get("trajectory_id", "")) for seq in batch]),
        "role": _column([str(seq.metadata.get("role", "")) for seq in batch]),
    }
