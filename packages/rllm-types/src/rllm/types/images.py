"""Images in chat messages: parse ``data:`` URIs, check them against limits, address them by hash.

Shared by the gateway (which refuses a bad image with a 400 naming the field) and the SDK (which
builds image blocks and refuses bad ones before any call is made). Parsing a data URI needs
nothing but the standard library; reading an image's format and size needs Pillow (the
``images`` extra), imported only when an image is actually checked.
"""

from __future__ import annotations

import base64
import binascii
import copy
import hashlib
import io
import warnings
from typing import TYPE_CHECKING

import msgspec

from rllm.types.errors import InvariantError

if TYPE_CHECKING:
    from rllm.types.episode import Episode
    from rllm.types.messages import Message

# What OpenAI's vision endpoints and vLLM's image loaders accept.
DEFAULT_IMAGE_FORMATS: tuple[str, ...] = ("PNG", "JPEG", "GIF", "WEBP")
_MIME_OF = {"PNG": "image/png", "JPEG": "image/jpeg", "GIF": "image/gif", "WEBP": "image/webp"}


class ImageError(InvariantError):
    """An image is malformed, too large or of an unsupported format; ``field`` names where."""


class ImageLimits(msgspec.Struct, frozen=True, kw_only=True):
    """What an accepted image may be: decoded bytes, width x height, Pillow format names."""

    max_bytes: int = 20 * 1024 * 1024
    max_pixels: int = 40_000_000
    formats: tuple[str, ...] = DEFAULT_IMAGE_FORMATS


class ImageInfo(msgspec.Struct, frozen=True):
    """A checked image: its format, size and the sha256 of its bytes (its content address)."""

    format: str
    width: int
    height: int
    sha256: str


def parse_data_uri(url: str, field: str = "url") -> tuple[str, bytes]:
    """``data:<mime>;base64,<payload>`` -> (mime, decoded bytes); ImageError names ``field``."""
    if not url.startswith("data:"):
        raise ImageError("not a data: URI", field)
    header, sep, payload = url[5:].partition(",")
    if not sep:
        raise ImageError("malformed data URI: no ',' between header and payload", field)
    mime, *params = header.split(";")
    if "base64" not in params:
        raise ImageError("data URI must be base64-encoded (';base64,')", field)
    if not mime.startswith("image/"):
        raise ImageError(f"data URI media type must be image/*, got {mime!r}", field)
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError("data URI payload is not valid base64", field) from None
    if not data:
        raise ImageError("data URI holds no image bytes", field)
    return mime, data


def inspect_image(data: bytes, limits: ImageLimits | None = None, field: str = "image") -> ImageInfo:
    """Check ``data`` is a readable image within ``limits`` (from its header and a structural
    check, without decoding every pixel: cheap enough for a proxy's event loop)."""
    limits = limits or ImageLimits()
    if len(data) > limits.max_bytes:
        raise ImageError(f"image is {len(data)} bytes, more than the limit of {limits.max_bytes}", field)
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            # Our own pixel limit below is the one that applies; Pillow's bomb warning is noise.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
        fmt, (width, height) = img.format or "", img.size
    except Image.DecompressionBombError:
        raise ImageError(f"image has more than {limits.max_pixels} pixels", field) from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError):
        raise ImageError("bytes are not a readable image", field) from None
    if fmt not in limits.formats:
        raise ImageError(f"unsupported image format {fmt!r}; expected one of {list(limits.formats)}", field)
    if width * height > limits.max_pixels:
        raise ImageError(
            f"image is {width}x{height} = {width * height} pixels, more than the limit of {limits.max_pixels}",
            field,
        )
    try:
        img.verify()  # structure and checksums (PNG CRCs), not a full decode
    except Exception as exc:  # Pillow raises many types for corrupt data; all mean the same here
        raise ImageError(f"image data is corrupt: {type(exc).__name__}", field) from None
    return ImageInfo(fmt, width, height, hashlib.sha256(data).hexdigest())


def check_image_url(url: str, limits: ImageLimits | None = None, field: str = "url") -> ImageInfo | None:
    """Check an ``image_url.url``: a data URI is decoded and inspected; an http(s) URL is left to
    the model server (None). Anything else raises ImageError naming ``field``."""
    if url.startswith(("http://", "https://")):
        return None
    if not url.startswith("data:"):
        raise ImageError("image URL must be a data: URI or an http(s) URL", field)
    _, data = parse_data_uri(url, field)
    return inspect_image(data, limits, field)


def check_message_images(messages: list[Message], limits: ImageLimits | None = None) -> list[ImageInfo]:
    """Check every image block of ``messages``; the error's field is e.g.
    ``[0].content[1].image_url`` (prefix it with the list's own name)."""
    from rllm.types.messages import ImageBlock

    infos: list[ImageInfo] = []
    for i, msg in enumerate(messages):
        if isinstance(msg.content, list):
            for j, block in enumerate(msg.content):
                if isinstance(block, ImageBlock):
                    info = check_image_url(block.image_url.url, limits, f"[{i}].content[{j}].image_url")
                    if info is not None:
                        infos.append(info)
    return infos


IMAGE_REF_PREFIX = "rllm-image:sha256:"


def image_ref(sha256: str) -> str:
    """The URL an interned image block holds in place of its data URI."""
    return IMAGE_REF_PREFIX + sha256


def intern_images(
    messages: list[Message], shared: dict[str, str] | None = None
) -> tuple[list[Message], dict[str, str]]:
    """Replace every data-URI image of ``messages`` by its content address.

    Returns new messages whose image blocks hold ``rllm-image:sha256:<hex>`` (hash of the decoded
    bytes) and the map hash -> data URI, each image once however often it appears. ``shared``
    (e.g. a session's map) makes equal images share one string, so a history resent on every
    turn holds its image once. The input messages are not changed. Call after the images were
    checked: an undecodable data URI is left as it is.
    """
    from rllm.types.messages import ImageBlock, ImageURL

    images: dict[str, str] = {}
    out: list[Message] = []
    for msg in messages:
        if not isinstance(msg.content, list) or not any(
            isinstance(b, ImageBlock) and b.image_url.url.startswith("data:") for b in msg.content
        ):
            out.append(msg)
            continue
        blocks = []
        for block in msg.content:
            if isinstance(block, ImageBlock) and block.image_url.url.startswith("data:"):
                try:
                    _, data = parse_data_uri(block.image_url.url)
                except ImageError:
                    blocks.append(block)
                    continue
                digest = hashlib.sha256(data).hexdigest()
                url = block.image_url.url
                if shared is not None:
                    url = shared.setdefault(digest, url)
                images.setdefault(digest, url)
                block = ImageBlock(ImageURL(image_ref(digest), block.image_url.detail))
            blocks.append(block)
        out.append(msgspec.structs.replace(msg, content=blocks))
    return out, images


def restore_images(messages: list[Message], images: dict[str, str]) -> list[Message]:
    """The inverse of intern_images: image references replaced by their data URIs again. A
    reference missing from ``images`` raises ImageError naming the block."""
    from rllm.types.messages import ImageBlock, ImageURL

    out: list[Message] = []
    for i, msg in enumerate(messages):
        if not isinstance(msg.content, list):
            out.append(msg)
            continue
        blocks = []
        for j, block in enumerate(msg.content):
            if isinstance(block, ImageBlock) and block.image_url.url.startswith(IMAGE_REF_PREFIX):
                digest = block.image_url.url[len(IMAGE_REF_PREFIX) :]
                if digest not in images:
                    raise ImageError(
                        f"image {digest[:12]}... is not attached", f"[{i}].content[{j}].image_url"
                    )
                block = ImageBlock(ImageURL(images[digest], block.image_url.detail))
            blocks.append(block)
        out.append(msgspec.structs.replace(msg, content=blocks))
    return out


def pack_episode_images(episode: Episode) -> Episode:
    """``episode`` as it should be stored: each distinct image once, in ``episode.images``.

    The same diagram is usually in every step of a trajectory and in every role of a flow; the
    copy's steps keep only the hashes (values "") and decoding the copy fills them again
    (``Episode.__post_init__``). The input is not changed (the trainer still reads its steps),
    and is returned as it is when no image is in two steps (packing would only add the map).
    """
    uses: dict[str, int] = {}
    for trajectory in episode.trajectories:
        for step in trajectory.steps:
            for digest, uri in step.images.items():
                if uri:
                    uses[digest] = uses.get(digest, 0) + 1
    if not any(n > 1 for n in uses.values()):
        return episode
    shared: dict[str, str] = dict(episode.images)
    trajectories = []
    for trajectory in episode.trajectories:
        steps = []
        for step in trajectory.steps:
            if step.images:
                for digest, uri in step.images.items():
                    if uri:
                        shared.setdefault(digest, uri)
                step = msgspec.structs.replace(step, images=dict.fromkeys(step.images, ""))
            steps.append(step)
        trajectories.append(msgspec.structs.replace(trajectory, steps=steps))
    packed = copy.copy(episode)  # not structs.replace: __post_init__ would fill the steps again
    packed.trajectories = trajectories
    packed.images = shared
    return packed


def data_uri(data: bytes, fmt: str) -> str:
    """A base64 data URI for image bytes of Pillow format ``fmt``."""
    mime = _MIME_OF.get(fmt.upper(), f"image/{fmt.lower()}")
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


__all__ = [
    "DEFAULT_IMAGE_FORMATS",
    "IMAGE_REF_PREFIX",
    "ImageError",
    "ImageInfo",
    "ImageLimits",
    "check_image_url",
    "check_message_images",
    "data_uri",
    "image_ref",
    "inspect_image",
    "intern_images",
    "pack_episode_images",
    "parse_data_uri",
    "restore_images",
]
