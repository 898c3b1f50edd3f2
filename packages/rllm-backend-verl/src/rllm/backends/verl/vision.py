"""Pixel inputs and M-RoPE positions of TrainSequences with images, laid out for verl's Qwen-VL path.

verl 0.9.1's agent loop gives each row of a vision-language batch (and its FSDP engine reads):
``non_tensor_batch["multi_modal_inputs"][row]``, a dict of tensors from the model's processor
(``pixel_values`` [patches, channels * temporal * patch**2], ``image_grid_thw`` [images, 3] and
``images_seqlens``, patches per image), concatenated across the micro-batch and passed to the
model's forward; and ``position_ids`` of shape [4, seq]: row 0 the text positions (what flash
attention's varlen path reads), rows 1-3 the model's own M-RoPE (temporal, height, width)
indices from ``get_rope_index`` with image tokens typed 1. This module builds the same from a
sequence's ``images`` (data URIs in placeholder order, as the engine's sequences give them), with
the same image processor the sampler used, so the training forward sees the sampled pixels.
"""

from __future__ import annotations

import functools
import io
import types
from pathlib import Path
from typing import Any

import torch

from rllm.types import TrainSequence
from rllm.types.errors import RLLMError
from rllm.types.images import ImageError, parse_data_uri


class VisionRowError(RLLMError, ValueError):
    """A sequence's images do not fit its tokens; the message names the sequence."""


class VisionRows:
    """The model's image processor, image token and M-RoPE index, for one model."""

    def __init__(self, config: Any, image_processor: Any, rope_index: Any) -> None:
        self.config = config
        self.image_processor = image_processor
        self.image_token_id = int(config.image_token_id)
        self._rope_index = rope_index  # None: a model with 1-D positions

    @property
    def mrope(self) -> bool:
        return self._rope_index is not None

    def row(self, seq: TrainSequence, index: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """(multi_modal_inputs, position ids [4, n] or [1, n]) of one sequence; a sequence without
        images gets {} and text positions (in M-RoPE form when the model uses it)."""
        tokens = torch.tensor(list(seq.input_ids), dtype=torch.int64)
        n = len(tokens)
        is_image = tokens == self.image_token_id
        text_positions = torch.arange(n, dtype=torch.int64)[None, :]
        if not seq.images:
            if bool(is_image.any()):
                raise VisionRowError(f"sequence {index}: {int(is_image.sum())} image tokens but no images")
            return {}, text_positions.expand(4, n).clone() if self.mrope else text_positions
        pixel_values, grid = self.pixels(seq.images, index)
        merge = self.image_processor.merge_size**2
        needed = int(grid.prod(-1).sum()) // merge
        if int(is_image.sum()) != needed:
            raise VisionRowError(
                f"sequence {index}: {int(is_image.sum())} image tokens, but its {len(seq.images)} images "
                f"take {needed}"
            )
        inputs = {
            "pixel_values": pixel_values,
            "image_grid_thw": grid,
            "images_seqlens": torch.repeat_interleave(grid[:, 1] * grid[:, 2], grid[:, 0]),
        }
        if not self.mrope:
            return inputs, text_positions
        mm_token_type_ids = is_image.to(torch.int64)[None, :]
        rope, _ = self._rope_index(tokens[None, :], mm_token_type_ids=mm_token_type_ids, image_grid_thw=grid)
        return inputs, torch.cat([text_positions, rope[:, 0, :]], dim=0)

    def pixels(self, images: list[str], index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(pixel_values, image_grid_thw) of data-URI images, through the model's image processor."""
        from PIL import Image

        decoded = []
        for k, url in enumerate(images):
            where = f"sequence {index}: images[{k}]"
            try:
                _, data = parse_data_uri(url, f"images[{k}]")
                with Image.open(io.BytesIO(data)) as img:
                    decoded.append(img.convert("RGB"))
            except ImageError as exc:
                raise VisionRowError(f"{where}: {exc.reason}") from None
            except Exception as exc:  # Pillow raises many types for corrupt data
                raise VisionRowError(f"{where}: cannot be decoded ({type(exc).__name__})") from None
        out = self.image_processor(images=decoded, return_tensors="pt")
        return out["pixel_values"], out["image_grid_thw"].to(torch.int64)


def load_vision_rows(model: str) -> VisionRows | None:
    """VisionRows for a vision-language model directory or hub name; None for a text-only model.

    The M-RoPE index is the model class's own ``get_rope_index`` bound to the config, as verl's
    ``hf_processor`` binds it (so no weights are loaded for it)."""
    from transformers import MODEL_MAPPING, AutoConfig
    from transformers.models.auto.image_processing_auto import AutoImageProcessor

    source = str(Path(model).expanduser()) if Path(model).expanduser().exists() else model
    config = AutoConfig.from_pretrained(source)
    if not hasattr(config, "vision_config") or getattr(config, "image_token_id", None) is None:
        return None
    image_processor = AutoImageProcessor.from_pretrained(source)
    # The lazy auto-mapping holds model classes; its declared value type hides their methods.
    model_class: Any = MODEL_MAPPING.get(type(config), None)
    rope_index = None
    if model_class is not None and hasattr(model_class, "get_rope_index"):
        owner = types.SimpleNamespace(config=config)
        if hasattr(model_class, "get_vision_position_ids"):
            owner.get_vision_position_ids = types.MethodType(model_class.get_vision_position_ids, owner)
        rope_index = types.MethodType(model_class.get_rope_index, owner)
    return VisionRows(config, image_processor, rope_index)


@functools.lru_cache(maxsize=4)
def vision_rows_for(model: str) -> VisionRows | None:
    """:func:`load_vision_rows`, once per model for the life of the process."""
    return load_vision_rows(model)


__all__ = ["VisionRowError", "VisionRows", "load_vision_rows", "vision_rows_for"]
