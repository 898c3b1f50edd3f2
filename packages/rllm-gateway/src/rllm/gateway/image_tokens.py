"""Image placeholder tokens for cumulative mode: how many tokens each image takes in the prompt.

A vision-language chat template renders each image as one placeholder (Qwen-VL:
``<|vision_start|><|image_pad|><|vision_end|>``); the model's processor then repeats the pad
once per merged patch of the image's grid. In cumulative mode the gateway renders the prompt
itself, so it expands each placeholder the same way, from the model's own image processor:
``get_number_of_image_patches(height, width)`` (the resize rule the processor applies to the
pixels, computed from the image's size alone, as vLLM does to place placeholders) divided by
``merge_size**2``. The pixels themselves are the sampler's work: the gateway sends the image
bytes next to the token ids (``multi_modal_data``), and the sampler's own processing must give
the same grid, which it checks.

Supported: image processors of the Qwen-VL family (Qwen2-VL, Qwen2.5-VL and the tiny Qwen2-VL of
``rllm.backends.tinker.vlm_prompt``), the ones with ``merge_size`` and ``get_number_of_image_patches``.
Any other processor is named in a clear 400 instead of a guess.
"""

from __future__ import annotations

import hashlib
import io
from collections import OrderedDict
from pathlib import Path
from typing import Any

from rllm.gateway.errors import GatewayError
from rllm.types import ImageBlock, Message
from rllm.types.images import ImageError, parse_data_uri

_DEFAULT_IMAGE_TOKEN = "<|image_pad|>"  # Qwen-VL's, when the tokenizer does not name its own
_CACHE_SIZE = 4096  # distinct images remembered (sha256 -> token count), least recent dropped


class PromptImage:
    """One data-URI image of a chat request, in placeholder order: where it is, its URI and bytes."""

    __slots__ = ("data", "field", "url")

    def __init__(self, field: str, url: str, data: bytes) -> None:
        self.field = field
        self.url = url
        self.data = data


def prompt_images(messages: list[Message]) -> list[PromptImage]:
    """Every image block of ``messages`` in order (the order a chat template renders them);
    a 400 naming the block for an image that is not a data URI (its size cannot be known)."""
    out: list[PromptImage] = []
    for i, msg in enumerate(messages):
        if not isinstance(msg.content, list):
            continue
        for j, block in enumerate(msg.content):
            if not isinstance(block, ImageBlock):
                continue
            field = f"messages[{i}].content[{j}].image_url"
            url = block.image_url.url
            if not url.startswith("data:"):
                raise GatewayError(
                    400,
                    "cumulative mode needs images as data: URIs (it counts their tokens from the "
                    "image itself); send the image bytes, or use tokenizer_mode='plain'",
                    param=field,
                    code="unsupported_content",
                )
            try:
                _, data = parse_data_uri(url, field)
            except ImageError as exc:  # checked before already; kept for callers that did not
                raise GatewayError(400, f"invalid image at {field}: {exc.reason}", param=field) from None
            out.append(PromptImage(field, url, data))
    return out


class ImageTokens:
    """Expands a rendered prompt's image placeholders to the number of tokens each image takes."""

    def __init__(self, tokenizer: Any, image_processor: Any) -> None:
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.image_token: str = getattr(tokenizer, "image_token", None) or _DEFAULT_IMAGE_TOKEN
        ids = tokenizer.encode(self.image_token, add_special_tokens=False)
        self.problem: str | None = None
        if len(ids) != 1:
            self.problem = f"the tokenizer has no single token for the image placeholder {self.image_token!r}"
        elif not (
            hasattr(image_processor, "get_number_of_image_patches")
            and isinstance(getattr(image_processor, "merge_size", None), int)
        ):
            self.problem = (
                f"the model's image processor ({type(image_processor).__name__}) is not of the Qwen-VL "
                "kind whose placeholder tokens cumulative mode can count"
            )
        self.image_token_id: int | None = ids[0] if len(ids) == 1 else None
        self._counts: OrderedDict[str, int] = OrderedDict()

    @classmethod
    def load(cls, path: str, tokenizer: Any) -> ImageTokens | None:
        """The model's image processor from ``path`` (a directory or hub name), or None when the
        model has none (a text-only model). Loaded through transformers' image-processor auto
        class, which falls back to the Pillow implementation when torchvision is missing."""
        local = Path(path).expanduser()
        if local.is_dir() and not (local / "preprocessor_config.json").is_file():
            return None
        from transformers.models.auto.image_processing_auto import AutoImageProcessor

        try:
            processor = AutoImageProcessor.from_pretrained(str(local) if local.is_dir() else path)
        except (OSError, ValueError):  # no preprocessor config at a hub name: a text-only model
            return None
        return cls(tokenizer, processor)

    def count(self, image: PromptImage) -> int:
        """Placeholder tokens of one image: merged patches of the grid its size resizes to."""
        digest = hashlib.sha256(image.data).hexdigest()
        cached = self._counts.get(digest)
        if cached is not None:
            self._counts.move_to_end(digest)
            return cached
        from PIL import Image

        try:
            with Image.open(io.BytesIO(image.data)) as img:  # the header only: no pixel decoding
                width, height = img.size
        except Exception:  # Pillow raises many types for corrupt data; checked before already
            raise GatewayError(
                400, f"invalid image at {image.field}: unreadable", param=image.field
            ) from None
        patches = self.image_processor.get_number_of_image_patches(height, width, {})
        n = int(patches) // self.image_processor.merge_size**2
        self._counts[digest] = n
        if len(self._counts) > _CACHE_SIZE:
            self._counts.popitem(last=False)
        return n

    def expand(self, text: str, images: list[PromptImage]) -> str:
        """``text`` with its k-th placeholder repeated as often as image k needs; a 400 when the
        template rendered a different number of placeholders than there are images."""
        if self.problem is not None and images:
            raise GatewayError(
                400,
                f"cumulative mode cannot place this model's image tokens: {self.problem}; "
                "use tokenizer_mode='plain'",
                param=images[0].field,
                code="unsupported_content",
            )
        parts = text.split(self.image_token)
        if len(parts) != len(images) + 1:
            raise GatewayError(
                400,
                f"the chat template rendered {len(parts) - 1} image placeholders for {len(images)} images",
                param="messages",
                code="unsupported_content",
            )
        if not images:
            return text
        counts = [self.count(image) for image in images]
        return parts[0] + "".join(
            self.image_token * n + rest for n, rest in zip(counts, parts[1:], strict=True)
        )


__all__ = ["ImageTokens", "PromptImage", "prompt_images"]
