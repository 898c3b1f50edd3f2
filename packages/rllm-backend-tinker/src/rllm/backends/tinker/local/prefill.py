"""The inputs of a batch's first forward pass (the prefill): its prompts left-padded into one
tensor, each prompt once.

Rows with the same text prompt (a request's n choices, a group's n=1 calls) are prefilled once
and the prompt's cache row, mask, positions and logits copied to each (``decoding.py``): the
same tokens and logprobs up to float rounding (a matmul over fewer rows may round otherwise, as
for a joined row), for 1/n of the prefill. Distinct prompts that begin alike (a shared system
prompt and instructions) prefill that beginning once (``shared_prefix``), its cache copied to
each, then their own remainders in a second pass, left-padded after it (masked holes, explicit
positions, as for a joined row). Rows with images are prefilled one each, with the M-RoPE
positions the model computes for them.
"""

from __future__ import annotations

from typing import Protocol, cast

import torch

from rllm.backends.tinker.local.generation_types import Row


class _RopeIndexOwner(Protocol):
    """The submodule of a vision-language model that computes its M-RoPE positions."""

    def get_rope_index(
        self,
        input_ids: torch.Tensor,
        mm_token_type_ids: torch.Tensor,
        image_grid_thw: torch.Tensor | None = None,
        video_grid_thw: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


def prefill_prompts(rows: list[Row], with_pixels: bool) -> tuple[list[list[int]], list[int] | None]:
    """The prompts to prefill, and each row's index into them (None: one prompt per row)."""
    return unique_prompts(rows) if not with_pixels else all_prompts(rows)


def unique_prompts(rows: list[Row]) -> tuple[list[list[int]], list[int] | None]:
    """The distinct prompts of ``rows`` in first-seen order, and each row's index into them
    (None when every prompt is distinct: nothing to share)."""
    index: dict[tuple[int, ...], int] = {}
    prompts: list[list[int]] = []
    source: list[int] = []
    for row in rows:
        prompt = row.pending.request.prompt_ids
        at = index.setdefault(tuple(prompt), len(prompts))
        if at == len(prompts):
            prompts.append(prompt)
        source.append(at)
    return prompts, (source if len(prompts) < len(rows) else None)


# Distinct prompts that open alike (a system prompt, a task's instructions) prefill their common
# beginning once when that saves at least this many positions (``shared_prefix``): the pass it
# adds reads every weight once more, which on a CPU costs about as much as computing some tens of
# positions (SmolLM2: ~20 ms a pass, ~0.3 ms a position in a large prefill).
MIN_SHARED_POSITIONS = 64


def shared_prefix(prompts: list[list[int]]) -> int:
    """How many leading tokens every one of ``prompts`` has in common, worth prefilling once for
    all of them (0 when not): each keeps at least its last token for its own pass, which gives
    its first logits."""
    if len(prompts) < 2:
        return 0
    first, shortest = prompts[0], min(len(p) for p in prompts)
    common = 0
    while common < shortest - 1 and all(p[common] == first[common] for p in prompts):
        common += 1
    return common if common * (len(prompts) - 1) >= MIN_SHARED_POSITIONS else 0


def all_prompts(rows: list[Row]) -> tuple[list[list[int]], None]:
    """Every row's prompt, unshared (image rows: their pixels go in by row)."""
    return [row.pending.request.prompt_ids for row in rows], None


def left_padded(
    prompts: list[list[int]], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """``prompts`` left-padded to the longest with ``pad_id``: ids and mask, [B, width] each."""
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, prompt in enumerate(prompts):
        input_ids[i, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        attention[i, width - len(prompt) :] = 1
    return input_ids.to(device), attention.to(device)


def vision_inputs(
    model: torch.nn.Module,
    device: torch.device,
    rows: list[Row],
    input_ids: torch.Tensor,
    attention: torch.Tensor,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """M-RoPE positions ([3, B, L], from the model's own get_rope_index over the left-padded
    batch) and the prefill's image inputs: every row's pixel patches and grids in row order."""
    width = input_ids.shape[1]
    mm = torch.zeros_like(input_ids)
    pixels, grids = [], []
    for i, row in enumerate(rows):
        v = row.pending.request.vision
        if v is None or v.pixel_values is None:
            continue
        mm[i, width - len(v.mm_token_type_ids) :] = torch.tensor(v.mm_token_type_ids)
        pixels.append(v.pixel_values)
        grids.append(v.image_grid_thw)
    grid = torch.cat(grids).to(device)
    # hasattr does not narrow an nn.Module (its __getattr__ types every attribute).
    rope_owner = cast(_RopeIndexOwner, next(m for m in model.modules() if hasattr(m, "get_rope_index")))
    positions, _ = rope_owner.get_rope_index(
        input_ids, mm_token_type_ids=mm, image_grid_thw=grid, attention_mask=attention
    )
    dtype = next(model.parameters()).dtype
    inputs = {
        "pixel_values": torch.cat(pixels).to(device, dtype),
        "image_grid_thw": grid,
        "mm_token_type_ids": mm,
    }
    return positions, inputs
