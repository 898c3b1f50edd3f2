"""Pixel inputs for training a vision-language model: each TrainSequence's images (data URIs,
in placeholder order) go through the same image processor the sampler used, so the training
forward pass sees exactly the pixels and image tokens sampling saw."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from rllm.backends.tinker.vlm_prompt import decode_images, image_token_counts, pixel_inputs
from rllm.tiny.vlm import load_image_processor
from rllm.types import TrainSequence
from rllm.types.errors import InputError
from rllm.types.images import parse_data_uri


def is_vision_model(path: str) -> bool:
    """A local model directory holding a vision-language model and its image processor."""
    directory = Path(path).expanduser()
    if not (directory / "preprocessor_config.json").is_file():
        return False
    import json

    config = json.loads((directory / "config.json").read_text())
    return "vision_config" in config


def load_vision(source: str) -> VisionInputs | None:
    """The image inputs of a vision-language model (``source`` a local directory or a hub name
    whose config has a vision tower), else None. The image processor comes from the same place
    as the weights (its ``preprocessor_config.json``), so a hub model needs no separate download."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(source)
    if not hasattr(config, "vision_config"):
        return None
    try:
        processor = load_image_processor(source)
    except OSError as exc:
        raise InputError(f"model {source!r} has a vision tower but no image processor: {exc}") from None
    return VisionInputs(processor, int(config.image_token_id))


class VisionInputs:
    """Renders the pixel inputs of right-padded rows of TrainSequences."""

    def __init__(self, image_processor: Any, image_token_id: int) -> None:
        self.image_processor = image_processor
        self.image_token_id = image_token_id

    def model_inputs(
        self, seqs: list[TrainSequence], width: int, device: torch.device, dtype: torch.dtype
    ) -> dict[str, torch.Tensor]:
        """``pixel_values``, ``image_grid_thw`` and ``mm_token_type_ids`` for the batch; {} when
        no sequence has images. Image tokens are the placeholder ids the policy did not sample
        (loss mask 0): a sampled placeholder id is an ordinary token, as it was when sampled."""
        if not any(s.images for s in seqs):
            return {}
        mm = np.zeros((len(seqs), width), dtype=np.int64)
        pixels, grids = [], []
        for row, s in enumerate(seqs):
            tokens = np.frombuffer(s.input_ids, dtype=np.int32)
            marks = (tokens == self.image_token_id) & (np.frombuffer(s.loss_mask, dtype=np.float32) == 0)
            if not s.images:
                if marks.any():
                    raise InputError(f"sequence {row} has image tokens but no images")
                continue
            data = [parse_data_uri(url, f"images[{k}]")[1] for k, url in enumerate(s.images)]
            values, grid = pixel_inputs(self.image_processor, decode_images(data))
            expected = sum(image_token_counts(self.image_processor, grid))
            if int(marks.sum()) != expected:
                raise InputError(
                    f"sequence {row}: {int(marks.sum())} image tokens, but its {len(s.images)} images "
                    f"need {expected}"
                )
            mm[row, : len(tokens)] = marks
            pixels.append(values)
            grids.append(grid)
        return {
            "pixel_values": torch.cat(pixels).to(device, dtype),
            "image_grid_thw": torch.cat(grids).to(device),
            "mm_token_type_ids": torch.from_numpy(mm).to(device),
        }


__all__ = ["VisionInputs", "is_vision_model", "load_vision"]
