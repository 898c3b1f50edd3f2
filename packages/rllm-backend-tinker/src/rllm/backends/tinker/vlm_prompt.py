"""Prompt rendering for vision-language models: OpenAI messages with data-URI images (or a
token-id prompt with images) into a Qwen2-VL-style model's inputs, with each image's placeholder
token repeated once per merged patch. The tiny Qwen2-VL the tests run it on is built by
:mod:`rllm.tiny.vlm`."""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

from rllm.tiny.vlm import IMAGE_PAD
from rllm.types.images import ImageError, parse_data_uri


@dataclass
class VlmInputs:
    """What one prompt gives the model: token ids (each image's pad token repeated once per
    merged patch), the images' pixel patches and their (t, h, w) grids, in prompt order.
    ``mm_token_type_ids`` marks image tokens with 1 (transformers computes M-RoPE positions
    from it; a completion appended for a training forward extends it with 0s)."""

    input_ids: list[int]
    pixel_values: Any  # torch.Tensor [patches, channels * temporal * patch * patch], or None
    image_grid_thw: Any  # torch.Tensor [images, 3], or None
    mm_token_type_ids: list[int]


def message_images(messages: list[dict[str, Any]]) -> list[bytes]:
    """The image bytes of every data-URI ``image_url`` block, in order; ImageError names the
    block of any other image (an http URL cannot be fetched here)."""
    images = []
    for i, msg in enumerate(messages):
        content = msg.get("content")
        if not isinstance(content, list):
            continue
        for j, block in enumerate(content):
            if isinstance(block, dict) and block.get("type") == "image_url":
                url = (block.get("image_url") or {}).get("url", "")
                images.append(parse_data_uri(url, f"messages[{i}].content[{j}].image_url"))
    return [data for _, data in images]


def render_vlm_prompt(
    tokenizer: Any,
    image_processor: Any,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool = True,
) -> VlmInputs:
    """Render ``messages`` (OpenAI shape, images as data URIs) through the chat template and the
    image processor, expanding each image's placeholder to its number of merged patches."""
    pil = decode_images(message_images(messages))
    text = tokenizer.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, tokenize=False
    )
    if not pil:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        return VlmInputs(ids, None, None, [0] * len(ids))
    pixel_values, grid = pixel_inputs(image_processor, pil)
    counts = image_token_counts(image_processor, grid)
    parts = text.split(IMAGE_PAD)
    if len(parts) != len(counts) + 1:
        raise ImageError(
            f"the chat template rendered {len(parts) - 1} image slots for {len(counts)} images", "messages"
        )
    expanded = parts[0] + "".join(IMAGE_PAD * n + rest for n, rest in zip(counts, parts[1:], strict=True))
    ids = tokenizer(expanded, add_special_tokens=False)["input_ids"]
    pad = tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    types = [int(t == pad) for t in ids]
    return VlmInputs(ids, pixel_values, grid, types)


def token_prompt_vlm_inputs(
    tokenizer: Any, image_processor: Any, prompt_ids: list[int], images: list[bytes], field: str = "images"
) -> VlmInputs:
    """A prompt that is already token ids (the gateway's cumulative mode renders it) with its
    images in placeholder order: each image's run of pad tokens must be as long as the image
    processor makes it, else ImageError (the prompt was rendered for other images or another
    processor)."""
    pad = tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    runs = placeholder_runs(prompt_ids, pad)
    types = [int(t == pad) for t in prompt_ids]
    if not images:
        if runs:
            raise ImageError(f"the prompt has {len(runs)} image placeholder runs but no images", "prompt")
        return VlmInputs(list(prompt_ids), None, None, types)
    pixel_values, grid = pixel_inputs(image_processor, decode_images(images, field))
    counts = image_token_counts(image_processor, grid)
    if runs != counts:
        raise ImageError(
            f"the prompt's image placeholder runs {runs} do not match its {len(counts)} images, "
            f"which take {counts} tokens",
            "prompt",
        )
    return VlmInputs(list(prompt_ids), pixel_values, grid, types)


def placeholder_runs(ids: list[int], pad: int) -> list[int]:
    """Lengths of the runs of consecutive ``pad`` ids, in order (one run per image)."""
    runs: list[int] = []
    previous = None
    for token in ids:
        if token == pad:
            if previous == pad:
                runs[-1] += 1
            else:
                runs.append(1)
        previous = token
    return runs


def decode_images(images: list[bytes], field: str = "images") -> list[Any]:
    """Pillow RGB images of encoded image bytes; ImageError names the one that cannot be read
    (``field[k]``)."""
    from PIL import Image

    out = []
    for k, data in enumerate(images):
        try:
            with Image.open(io.BytesIO(data)) as img:
                out.append(img.convert("RGB"))
        except Exception as exc:  # Pillow raises many types for corrupt data
            raise ImageError(f"image {k} cannot be decoded: {type(exc).__name__}", f"{field}[{k}]") from None
    return out


def pixel_inputs(image_processor: Any, images: list[Any]) -> tuple[Any, Any]:
    """(pixel_values, image_grid_thw) of Pillow images: the same images give the same tensors,
    so sampling and training see identical pixel inputs."""
    out = image_processor(images=images, return_tensors="pt")
    return out["pixel_values"], out["image_grid_thw"]


def image_token_counts(image_processor: Any, grid: Any) -> list[int]:
    """Placeholder tokens per image: its patches after the spatial merge."""
    merge = image_processor.merge_size**2
    return [int(g.prod()) // merge for g in grid]


__all__ = [
    "VlmInputs",
    "decode_images",
    "image_token_counts",
    "message_images",
    "pixel_inputs",
    "placeholder_runs",
    "render_vlm_prompt",
    "token_prompt_vlm_inputs",
]
