"""Continuous batching for the local sampler: requests that arrive while a batch decodes join it.

A newcomer rides on the running batch's next decode step, in the same forward pass: the step's
input is ``T`` columns wide (the longest newcomer prompt); each running row has its next token in
the last column and masked padding before it, each newcomer its left-padded prompt. The KV cache
gets zero rows for the newcomers (masked: they see none of the earlier columns). So 32 requests
that reach the server one by one cost about the forward passes of one batch of 32, not of one
batch per arrival wave, and a request never waits for a whole batch to finish before it starts.

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
