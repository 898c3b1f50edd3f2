"""A tiny random-init Qwen2-VL and its processor parts, built locally (tests and toy tasks), and
the rendering of OpenAI messages with data-URI images into the model's inputs.

Nothing is downloaded: the tokenizer is tiny.build_tokenizer's word-level one plus Qwen2-VL's
vision tokens, and the image processor is Qwen2-VL's Pillow one built from its parameters. The
parts are saved separately (tokenizer files + ``preprocessor_config.json``) and loaded with
AutoTokenizer and :func:`load_image_processor`, because transformers' combined Qwen2-VL
processor also wants a video processor, which needs torchvision.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rllm.tiny import build_tokenizer
from rllm.types.images import ImageError, parse_data_uri

VISION_START, IMAGE_PAD, VISION_END = "<|vision_start|>", "<|image_pad|>", "<|vision_end|>"
VISION_TOKENS = [VISION_START, IMAGE_PAD, VISION_END]

# tiny.CHAT_TEMPLATE with content blocks: text as it is, each image as Qwen2-VL's
# "<|vision_start|><|image_pad|><|vision_end|>" (one pad, expanded per image by render_vlm_prompt).
# The generation prompt ends in the space the rendered assistant message has after its role
# tag, so the prompt text + a decoded reply ("word word <|end|>") is a prefix of the next turn's
# rendering: cumulative mode then extends multi-turn histories token for token.
VLM_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|' + message['role'] + '|> ' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for block in message['content'] %}"
    "{% if block['type'] == 'text' %}{{ block['text'] }}"
    "{% else %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}{% endif %}"
    "{% endfor %}{% endif %}{{ ' <|end|> ' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|> ' }}{% endif %}"
)


def build_vlm_tokenizer(words: Iterable[str] = ()) -> Any:
    """tiny.build_tokenizer's tokenizer with the vision tokens and :data:`VLM_CHAT_TEMPLATE`."""
    tokenizer = build_tokenizer(words)
    tokenizer.add_tokens(VISION_TOKENS, special_tokens=True)
    tokenizer.chat_template = VLM_CHAT_TEMPLATE
    return tokenizer


def build_image_processor(min_pixels: int = 28 * 28 * 4, max_pixels: int = 28 * 28 * 16) -> Any:
    """Qwen2-VL's Pillow image processor; the pixel bounds keep images to a few dozen tokens
    (a 256x256 diagram -> 112x112 -> 16 image tokens)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(min_pixels=min_pixels, max_pixels=max_pixels)


def load_image_processor(path: str | Path) -> Any:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil.from_pretrained(str(path))


def init_tiny_vlm(
    path: str | Path,
    vocab_words: Iterable[str] = (),
    seed: int = 0,
    *,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 2,
    intermediate_size: int = 256,
    max_positions: int = 2048,
    vision_depth: int = 1,
    vision_dim: int = 64,
) -> Path:
    """Write a random-init Qwen2-VL (2 text layers, 1 vision block) with its tokenizer and image
    processor to ``path`` and return it. Deterministic for a seed."""
    import torch
    from transformers import GenerationConfig, Qwen2VLConfig, Qwen2VLForConditionalGeneration

    head_dim = hidden_size // num_heads
    if hidden_size % num_heads or head_dim % 8:
        raise ValueError(f"init_tiny_vlm: hidden_size/num_heads must be a multiple of 8, got {head_dim}")
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_vlm_tokenizer(vocab_words)
    start, pad, end = tokenizer.convert_tokens_to_ids(VISION_TOKENS)
    # M-RoPE splits each head's rotary half into (time, height, width) sections.
    half = head_dim // 2
    section = [half - 2 * (3 * half // 8), 3 * half // 8, 3 * half // 8]
    config = Qwen2VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": hidden_size,
            "intermediate_size": intermediate_size,
            "num_hidden_layers": num_layers,
            "num_attention_heads": num_heads,
            "num_key_value_heads": num_heads,
            "max_position_embeddings": max_positions,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": section},
            "pad_token_id": tokenizer.pad_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "bos_token_id": None,
        },
        vision_config={
            "depth": vision_depth,
            "embed_dim": vision_dim,
            "hidden_size": hidden_size,
            "num_heads": 2,
            "mlp_ratio": 2,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
        image_token_id=pad,
        video_token_id=pad,
        vision_start_token_id=start,
        vision_end_token_id=end,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = Qwen2VLForConditionalGeneration(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    build_image_processor().save_pretrained(out)
    return out


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
    "VISION_TOKENS",
    "VLM_CHAT_TEMPLATE",
    "VlmInputs",
    "build_image_processor",
    "build_vlm_tokenizer",
    "decode_images",
    "image_token_counts",
    "init_tiny_vlm",
    "load_image_processor",
    "message_images",
    "pixel_inputs",
    "placeholder_runs",
    "render_vlm_prompt",
    "token_prompt_vlm_inputs",
]
