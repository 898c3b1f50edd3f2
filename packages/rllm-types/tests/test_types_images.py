"""rllm.types.images: data-URI parsing and image checks; malformed input only ever raises ImageError."""

from __future__ import annotations

import base64
import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from rllm.types import Message
from rllm.types.images import (
    ImageError,
    ImageLimits,
    check_image_url,
    check_message_images,
    data_uri,
    inspect_image,
    parse_data_uri,
)


def _png(w: int = 8, h: int = 6, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (200, 30, 30)).save(buf, format=fmt)
    return buf.getvalue()


def test_a_png_data_uri_is_checked_and_hashed():
    data = _png()
    info = check_image_url(data_uri(data, "PNG"))
    assert (info.format, info.width, info.height) == ("PNG", 8, 6)
    assert info.sha256 == __import__("hashlib").sha256(data).hexdigest()
    assert check_image_url("https://example.com/cat.png") is None


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("data:image/png;base64", "no ','"),
        ("data:image/png,abcd", "base64"),
        ("data:text/plain;base64,aGVsbG8=", "image/*"),
        ("data:image/png;base64,!!!!", "not valid base64"),
        ("data:image/png;base64,", "no image bytes"),
        ("data:image/png;base64,aGVsbG8gd29ybGQ=", "not a readable image"),
        ("ftp://host/x.png", "data: URI or an http(s) URL"),
    ],
)
def test_malformed_urls_name_the_field(url, needle):
    with pytest.raises(ImageError) as e:
        check_image_url(url, field="messages[0].content[1].image_url")
    assert needle in e.value.reason
    assert e.value.field == "messages[0].content[1].image_url"


def test_limits_bytes_pixels_and_formats():
    data = _png(20, 20)
    with pytest.raises(ImageError, match="bytes"):
        inspect_image(data, ImageLimits(max_bytes=10))
    with pytest.raises(ImageError, match="400 pixels"):
        inspect_image(data, ImageLimits(max_pixels=399))
    with pytest.raises(ImageError, match="unsupported image format 'BMP'"):
        inspect_image(_png(fmt="BMP"))
    assert inspect_image(_png(fmt="BMP"), ImageLimits(formats=("BMP",))).format == "BMP"


def test_corrupt_png_is_refused():
    data = bytearray(_png(16, 16))
    data[-20] ^= 0xFF  # inside the IDAT/IEND chunks: a CRC no longer matches
    with pytest.raises(ImageError):
        inspect_image(bytes(data))


def test_message_images_name_the_block():
    good = {"type": "image_url", "image_url": {"url": data_uri(_png(), "PNG")}}
    bad = {"type": "image_url", "image_url": {"url": "data:image/png;base64,@@"}}
    from rllm.types import convert

    msgs = convert(
        [
            {"role": "system", "content": "s"},
            {"role": "user", "content": [{"type": "text", "text": "q"}, good, bad]},
        ],
        list[Message],
    )
    with pytest.raises(ImageError) as e:
        check_message_images(msgs)
    assert e.value.field == "[1].content[2].image_url"
    assert len(check_message_images(msgs[:1])) == 0


_header = st.sampled_from(["data:", "data:image/png", "data:image/png;base64", "data:;base64", "DATA:", ""])
_payload = st.one_of(
    st.text(max_size=40),
    st.binary(max_size=60).map(lambda b: base64.b64encode(b).decode()),
    st.binary(max_size=60).map(lambda b: base64.b64encode(_png()[:20] + b).decode()),
)


@settings(max_examples=300, deadline=None)
@given(_header, st.sampled_from([",", ";", ""]), _payload)
def test_malformed_data_uris_raise_only_image_error(header, sep, payload):
    url = header + sep + payload
    try:
        info = check_image_url(url, field="f")
    except ImageError as exc:
        assert exc.field == "f" and exc.reason
    else:
        assert info is None or info.format in ("PNG", "JPEG", "GIF", "WEBP")


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=200), st.integers(0, 300))
def test_mutated_pngs_raise_only_image_error(noise, at):
    data = bytearray(_png(12, 9))
    data[at % len(data) : at % len(data) + len(noise)] = noise
    try:
        parse_data_uri(data_uri(bytes(data), "PNG"))
        inspect_image(bytes(data))
    except ImageError:
        pass


def test_intern_and_restore_round_trip_with_one_copy_per_image():
    from rllm.types import Step, convert, from_msgpack, to_msgpack
    from rllm.types.images import image_ref, intern_images, restore_images

    a, b = data_uri(_png(3, 3), "PNG"), data_uri(_png(5, 5), "PNG")
    raw = [
        {
            "role": "user",
            "content": [{"type": "image_url", "image_url": {"url": a}}, {"type": "text", "text": "x"}],
        },
        {"role": "assistant", "content": "ok"},
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": a, "detail": "high"}},
                {"type": "image_url", "image_url": {"url": b}},
            ],
        },
    ]
    msgs = convert(raw, list[Message])
    shared: dict[str, str] = {}
    interned, images = intern_images(msgs, shared)
    assert len(images) == 2 and shared == images
    assert interned[0].content[0].image_url.url == image_ref(
        __import__("hashlib").sha256(_png(3, 3)).hexdigest()
    )
    assert interned[2].content[0].image_url.detail == "high"
    assert msgs == convert(raw, list[Message])  # the input is untouched
    assert restore_images(interned, images) == msgs
    step = from_msgpack(to_msgpack(Step(input=interned, images=images)), Step)
    assert restore_images(step.input, step.images) == msgs
    with pytest.raises(ImageError) as e:
        restore_images(interned, {})
    assert e.value.field == "[0].content[0].image_url"
    # a second call sharing the map reuses the same string objects
    _again, images2 = intern_images(convert(raw, list[Message]), shared)
    assert all(images2[h] is shared[h] for h in images2)


def test_an_episode_stores_each_image_once_and_its_steps_get_them_back():
    from rllm.types import Episode, Step, Trajectory, convert, from_json, from_msgpack, to_json, to_msgpack
    from rllm.types.images import intern_images, pack_episode_images

    a, b = data_uri(_png(7, 7), "PNG"), data_uri(_png(9, 4), "PNG")

    def step(*urls: str) -> Step:
        blocks = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
        messages, images = intern_images(convert([{"role": "user", "content": blocks}], list[Message]))
        return Step(input=messages, images=images)

    # the same diagram in every step of two roles (a solver and a judge), a second one once
    episode = Episode(
        task_id="t",
        trajectories=[
            Trajectory(role="solver", steps=[step(a), step(a, b)]),
            Trajectory(role="judge", steps=[step(a)]),
        ],
    )
    before = to_msgpack(episode)
    packed = pack_episode_images(episode)
    payload_a, payload_b = (u.split(",", 1)[1].encode() for u in (a, b))
    for wire in (to_msgpack(packed), to_json(packed)):
        assert wire.count(payload_a) == 1 and wire.count(payload_b) == 1
    assert before.count(payload_a) == 3  # unpacked, each step carried its own copy
    assert to_msgpack(episode) == before  # packing copies; the episode in hand is unchanged
    for decoded in (from_msgpack(to_msgpack(packed), Episode), from_json(to_json(packed), Episode)):
        assert [s.images for t in decoded.trajectories for s in t.steps] == [
            s.images for t in episode.trajectories for s in t.steps
        ]
    plain = Episode(task_id="plain")
    assert pack_episode_images(plain) is plain  # nothing to pack: no copy
    # a packed reference with nothing behind it is named, not silently dropped
    from rllm.types import InvariantError

    orphan = Trajectory(steps=[Step(images={"ab" * 32: ""})])
    with pytest.raises(InvariantError) as e:
        Episode(task_id="t", trajectories=[orphan], images={"cd" * 32: a})
    assert e.value.field == "trajectories[0].steps[0].images"
