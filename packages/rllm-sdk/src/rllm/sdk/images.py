"""Image content blocks for a flow's messages: build a checked data-URI block from a file, bytes
or a Pillow image, so a bad image fails in the agent with a one-line error instead of as a 400.

Needs Pillow (``rllm-sdk[images]``).
"""

from __future__ import annotations

import io
from os import PathLike
from pathlib import Path
from typing import Any, Literal

from rllm.types.images import ImageError, ImageInfo, ImageLimits, data_uri, inspect_image


def image_block(
    image: str | PathLike[str] | bytes | Any,
    *,
    limits: ImageLimits | None = None,
    detail: Literal["auto", "low", "high"] | None = None,
) -> dict[str, Any]:
    """An OpenAI ``image_url`` content block holding ``image`` as a base64 data URI.

    ``image`` is a file path, the image file's bytes, or a Pillow ``Image`` (saved as PNG). The
    image is decoded in full and checked against ``limits`` (the gateway's defaults unless
    given); ImageError names what is wrong.
    """
    data, field = _image_bytes(image)
    info = inspect_image(data, limits, field)
    _decode_fully(data, field)
    url: dict[str, Any] = {"url": data_uri(data, info.format)}
    if detail is not None:
        url["detail"] = detail
    return {"type": "image_url", "image_url": url}


def image_info(block: dict[str, Any], limits: ImageLimits | None = None) -> ImageInfo | None:
    """Check an ``image_url`` block built elsewhere; None for an http(s) URL (not fetched)."""
    from rllm.types.images import check_image_url

    url = block.get("image_url", {}).get("url") if isinstance(block, dict) else None
    if not isinstance(url, str):
        raise ImageError("block has no image_url.url string", "image_url.url")
    return check_image_url(url, limits, "image_url.url")


def _image_bytes(image: Any) -> tuple[bytes, str]:
    if isinstance(image, bytes | bytearray | memoryview):
        return bytes(image), "image"
    if isinstance(image, str | PathLike):
        path = Path(image)
        try:
            return path.read_bytes(), str(path)
        except OSError as exc:
            raise ImageError(f"cannot read image file: {exc.strerror or exc}", str(path)) from None
    if hasattr(image, "save") and hasattr(image, "size"):  # a Pillow Image, without importing PIL
        buf = io.BytesIO()
        image.save(buf, format="PNG")
        return buf.getvalue(), "image"
    raise ImageError(f"expected a path, bytes or a Pillow Image, got {type(image).__name__}", "image")


def _decode_fully(data: bytes, field: str) -> None:
    # The header check leaves truncated pixel data undetected; the agent's side can afford a decode.
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()
    except Exception as exc:  # Pillow raises many types for corrupt data; all mean the same here
        raise ImageError(f"image data is corrupt: {exc}", field) from None


__all__ = ["ImageError", "ImageInfo", "ImageLimits", "image_block", "image_info"]
