"""Images at the gateway: a bad data-URI image is a 400 naming its content block and leaves no
trace (refused before acceptance); a good one goes upstream and its call is traced."""

from __future__ import annotations

import hashlib
import io
import sqlite3

import openai
import pytest
from PIL import Image

from rllm.gateway import GatewayClient, GatewayConfig, GatewayServer
from rllm.types import ImageBlock, Message, convert
from rllm.types.images import data_uri, image_ref, restore_images


def _image(w: int = 8, h: int = 8, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (10, 120, 250)).save(buf, format=fmt)
    return buf.getvalue()


def _messages(url: str) -> list[dict]:
    return [
        {"role": "system", "content": "look"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "what?"}, {"type": "image_url", "image_url": {"url": url}}],
        },
    ]


@pytest.fixture(params=["memory", "sqlite"])
async def small_gateway(mock, request, tmp_path):
    store = "memory" if request.param == "memory" else f"sqlite:{tmp_path / 'traces.db'}"
    cfg = GatewayConfig(
        store=store, upstreams=[mock.url], health_interval_s=0, max_image_bytes=4096, max_image_pixels=64 * 64
    )
    async with GatewayServer(cfg) as server, GatewayClient(server.url) as gw:
        yield server, gw


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("data:image/png;base64,@@@", "not valid base64"),
        ("data:image/png;base64", "no ','"),
        ("data:application/pdf;base64,aGk=", "image/*"),
        ("data:image/png;base64,aGVsbG8=", "not a readable image"),
        (data_uri(_image(fmt="BMP"), "BMP"), "unsupported image format"),
        (data_uri(_image(65, 64), "PNG"), "pixels"),
        (data_uri(_image(2, 2, "TIFF") + b"\0" * 5000, "TIFF"), "bytes"),
        ("file:///etc/passwd", "data: URI or an http(s) URL"),
    ],
)
async def test_bad_images_are_a_400_naming_the_block_and_leave_no_trace(small_gateway, url, needle):
    _server, gw = small_gateway
    s = await gw.create_session()
    client = openai.AsyncOpenAI(base_url=s.base_url, api_key=s.token or "x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        await client.chat.completions.create(model="m", messages=_messages(url))
    err = e.value.body
    assert err["param"] == "messages[1].content[1].image_url"
    assert err["code"] == "invalid_image"
    assert needle in err["message"]
    await client.close()
    assert await gw.get_traces(s.session_id) == []


async def test_a_good_image_goes_upstream_and_is_kept_by_content_address(small_gateway, mock):
    _server, gw = small_gateway
    s = await gw.create_session()
    url = data_uri(_image(), "PNG")
    other = data_uri(_image(4, 4), "PNG")
    msgs = _messages(url)
    msgs[1]["content"].append({"type": "image_url", "image_url": {"url": url, "detail": "low"}})
    async with openai.AsyncOpenAI(base_url=s.base_url, api_key=s.token or "x", max_retries=0) as client:
        reply = await client.chat.completions.create(model="m", messages=msgs)
        msgs += [
            {"role": "assistant", "content": reply.choices[0].message.content},
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": other}}]},
        ]
        await client.chat.completions.create(model="m", messages=msgs)
    first, second = await gw.get_traces(s.session_id)
    assert first.status == second.status == "ok"
    digest = hashlib.sha256(_image()).hexdigest()
    assert first.images == {digest: url}  # the same image twice in one call: kept once
    refs = [b.image_url.url for b in first.messages[1].content if isinstance(b, ImageBlock)]
    assert refs == [image_ref(digest)] * 2
    assert set(second.images) == {digest, hashlib.sha256(_image(4, 4)).hexdigest()}
    restored = restore_images(second.messages, second.images)
    assert restored == convert(msgs, list[Message])  # exactly what the agent sent
    # the upstream got the data URIs themselves, not the references
    assert mock.stats.last_request["messages"][-1]["content"][0]["image_url"]["url"] == other
    if _server.config.store.startswith("sqlite:"):
        # once per session and hash in the file, however many traces show the image
        conn = sqlite3.connect(_server.config.store[len("sqlite:") :])
        count = "SELECT COUNT(*) FROM images WHERE session_id = ?"
        assert conn.execute(count, (s.session_id,)).fetchone()[0] == 2
        await gw.delete_session(s.session_id)
        assert conn.execute(count, (s.session_id,)).fetchone()[0] == 0
        conn.close()


def test_image_limits_are_validated():
    from rllm.types import InvariantError

    with pytest.raises(InvariantError, match="max_image_bytes"):
        GatewayConfig(max_image_bytes=0)
    with pytest.raises(InvariantError, match="image_formats"):
        GatewayConfig(image_formats=[])
    assert GatewayConfig(image_formats=["png"]).image_formats == ["PNG"]
