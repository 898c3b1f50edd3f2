"""The doctor's image check, for a model whose tokenizer folder holds an image processor.

A three-turn conversation with a new image in each user turn goes through the gateway in
cumulative mode: every turn must extend the previous one token for token (one segment), and each
prompt must hold exactly the image placeholder tokens the model's processor gives the images so
far (the gateway expands each placeholder from the image's size; the sampler sees the pixels).
"""

from __future__ import annotations

import base64
import struct
import zlib
from typing import Any

from rllm.cli.doctor_report import Check

NAME = "images (multi-turn)"
# Sizes that resize to different grids under Qwen-VL processors (28 px per merged patch).
_SIZES = ((56, 56), (112, 56), (84, 84))


def png_data_uri(width: int, height: int, shade: int) -> str:
    """A solid RGB PNG as a data URI (the doctor needs no imaging library to make one)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    row = b"\x00" + bytes((shade, 100, 200)) * width  # filter byte 0, then the pixels
    png = (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(row * height))
        + chunk(b"IEND", b"")
    )
    return "data:image/png;base64," + base64.b64encode(png).decode()


async def images_check(doctor: Any, images: Any) -> Check:
    """``doctor``: the running :class:`rllm.cli.doctor.Doctor`; ``images``: the gateway's
    ``ImageTokens`` for the model (its processor and placeholder token)."""
    from rllm.gateway.image_tokens import PromptImage
    from rllm.types.images import parse_data_uri

    if images.problem:
        return Check(NAME, "fail", f"the gateway cannot place this model's images: {images.problem}")
    sid = doctor.sid()
    doctor.sent = []
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "you are an agent"}]
    expected: list[int] = []  # placeholder tokens each turn's prompt must hold
    total = 0
    for i, (w, h) in enumerate(_SIZES):
        url = png_data_uri(w, h, 40 * i)
        _, data = parse_data_uri(url)
        total += images.count(PromptImage("doctor", url, data))
        expected.append(total)
        text = {"type": "text", "text": "look at this"}
        msgs.append({"role": "user", "content": [text, {"type": "image_url", "image_url": {"url": url}}]})
        msgs.append(await doctor.chat(sid, msgs, doctor.wrap(f"the answer is {i}")))
    traces = await doctor.client.get_traces(sid)
    pad = images.image_token_id
    got = [list(t.prompt_ids).count(pad) for t in traces]
    if got != expected:
        return Check(
            NAME,
            "fail",
            f"image placeholder tokens per turn {got}, the processor gives {expected} "
            f"({images.image_token!r})",
        )
    check = doctor._verdict(NAME, traces)
    if check.status == "pass":
        check.detail = f"{len(traces)} turns with an image each, one segment; image tokens per turn {got}"
    return check
