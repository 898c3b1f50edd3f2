"""Continuous batching for the local sampler: requests that arrive while a batch decodes join it.

A newcomer joins at the running batch's next decode step, in one of two ways (``fuse_join``
picks the cheaper):

- fused: it rides on the step's forward pass. The step's input is ``T`` columns wide (the
  longest newcomer prompt); each running row has its next token in the last column and masked
  padding before it, each newcomer its left-padded prompt. The KV cache gets zero rows for the
  newcomers (masked: they see none of the earlier columns). One forward pass, but every running
  row pays for ``T`` positions: ``A * (T - 1)`` positions of padding;
- beside: the running rows take their plain one-token step and the newcomers' prompts are
  prefilled in a pass of their own; the two caches are then stacked (``merge_cache``), the
  narrower left-padded with masked zero columns. A forward pass more, no padding rows, and the
  cache grows to the wider of the two instead of by ``T`` columns a join.

So 32 requests that reach the server one by one cost about the work of one batch of 32, not of
one batch per arrival wave, and a request never waits for a whole batch to finish before it
starts.

Each row attends only to its own tokens (explicit positions, masked holes), so a joined row's
tokens and logprobs are those of the same request decoded alone, up to float rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicLayer


def can_extend(cache: object) -> bool:
    """Only plain dynamic caches (no sliding window, quantised or offloaded layers) take new rows."""
    layers = getattr(cache, "layers", None)
    return bool(layers) and all(type(layer) is DynamicLayer and layer.is_initialized for layer in layers)


def extend_cache(cache: object, rows: int) -> None:
    """Append ``rows`` zero rows to every layer's keys and values (batch dimension)."""
    for layer in getattr(cache, "layers", []):
        keys, values = layer.keys, layer.values
        layer.keys = torch.cat([keys, keys.new_zeros((rows, *keys.shape[1:]))])
        layer.values = torch.cat([values, values.new_zeros((rows, *values.shape[1:]))])


def fuse_join(running: int, joining: int, width: int) -> bool:
    """Whether ``joining`` newcomer rows (prompts ``width`` wide) ride on the step of ``running``
    rows: only while the running rows' padding, ``running * (width - 1)`` positions, is no more
    than the newcomers' own prefill. Beyond that a pass of its own costs less: on a CPU a forward
    pass costs in proportion to its positions (31 running rows beside one 43-token prompt: 1,333
    positions for 74 useful ones), and its fixed cost is a few positions' worth."""
    return running * (width - 1) <= joining * width


def merge_cache(cache: object, joined: object) -> None:
    """Stack ``joined``'s rows under ``cache``'s (batch dimension), in place: the narrower of the
    two is left-padded with zero columns (its mask must have zeros there: ``left_pad``)."""
    for layer, other in zip(getattr(cache, "layers", []), getattr(joined, "layers", []), strict=True):
        width = max(layer.keys.shape[-2], other.keys.shape[-2])
        layer.keys = torch.cat([left_pad(layer.keys, width, -2), left_pad(other.keys, width, -2)])
        layer.values = torch.cat([left_pad(layer.values, width, -2), left_pad(other.values, width, -2)])


def left_pad(tensor: torch.Tensor, width: int, dim: int = -1) -> torch.Tensor:
    """``tensor`` with zeros before its ``dim`` axis, to ``width``."""
    missing = width - tensor.shape[dim]
    if missing <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # [A + J, T]
    attention: torch.Tensor  # [A + J, L + T]: the whole mask, cache columns first
    positions: torch.Tensor  # [A + J, T]


def joined_step(
    next_tokens: torch.Tensor,
    attention: torch.Tensor,
    last_positions: torch.Tensor,
    prompts: list[list[int]],
    pad_id: int,
) -> StepInputs:
    """One decode step of the A running rows fused with the prefill of J newcomer prompts.

    ``next_tokens`` [A, 1] are the running rows' sampled tokens, ``attention`` [A, L] their mask
    over the cache so far and ``last_positions`` [A, 1] their last position.
    """
    device = next_tokens.device
    running, cached = attention.shape
    width = max(len(p) for p in prompts)
    total = running + len(prompts)
    ids = torch.full((total, width), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros((total, cached + width), dtype=attention.dtype, device=device)
    positions = torch.zeros((total, width), dtype=last_positions.dtype, device=device)
    ids[:running, -1] = next_tokens[:, 0]
    mask[:running, :cached] = attention
    mask[:running, -1] = 1
    # The padding columns of a running row are masked; any position will do for them.
    positions[:running] = last_positions + 1
    for j, prompt in enumerate(prompts):
        row, n = running + j, len(prompt)
        ids[row, width - n :] = torch.tensor(prompt, dtype=torch.long, device=device)
        mask[row, cached + width - n :] = 1
        positions[row, width - n :] = torch.arange(n, dtype=positions.dtype, device=device)
    return StepInputs(input_ids=ids, attention=mask, positions=positions)
