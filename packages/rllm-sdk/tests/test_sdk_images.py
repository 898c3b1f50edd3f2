"""rllm.sdk.images: checked data-URI image blocks from paths, bytes and Pillow images."""

from __future__ import annotations

import base64
import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from rllm.sdk.images import ImageError, ImageLimits, image_block, image_info
from rllm.types import ImageBlock, convert


def _png(w: int = 10, h: int = 7) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), "white").save(buf, format="PNG")
    return buf.getvalue()


def test_blocks_from_path_bytes_and_pil_image(tmp_path):
    path = tmp_path / "d.png"
    path.write_bytes(_png())
    for source in (path, str(path), _png(), Image.open(io.BytesIO(_png()))):
        block = image_block(source, detail="low")
        assert block["image_url"]["url"].startswith("data:image/png;base64,")
        assert block["image_url"]["detail"] == "low"
        assert isinstance(convert(block, ImageBlock), ImageBlock)  # the types' shape
        info = image_info(block)
        assert (info.width, info.height) == (10, 7)


def test_bad_images_are_one_line_errors(tmp_path):
    with pytest.raises(ImageError, match="cannot read image file"):
        image_block(tmp_path / "missing.png")
    with pytest.raises(ImageError, match="not a readable image"):
        image_block(b"not an image")
    with pytest.raises(ImageError, match="pixels"):
        image_block(_png(100, 100), limits=ImageLimits(max_pixels=50))
    with pytest.raises(ImageError, match="expected a path, bytes or a Pillow Image"):
        image_block(42)
    truncated = _png(64, 64)
    with pytest.raises(ImageError):
        image_block(truncated[: len(truncated) // 2])
    with pytest.raises(ImageError, match=r"image_url\.url"):
        image_info({"type": "image_url"})


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=60))
def test_image_info_of_any_url_raises_only_image_error(tail):
    for url in ("data:image/png;base64," + tail, "data:" + tail, tail):
        try:
            image_info({"type": "image_url", "image_url": {"url": url}})
        except ImageError:
            pass


def test_round_trip_bytes_are_unchanged():
    data = _png()
    url = image_block(data)["image_url"]["url"]
    assert base64.b64decode(url.split(",", 1)[1]) == data
