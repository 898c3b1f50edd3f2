"""Server-sent events from an upstream's stream: split into events as the bytes arrive.

Pieces arrive in whatever sizes the network gives. Joining them into one growing buffer and
searching it from the start each time costs quadratic time in the size of an event that spans
many pieces; here each byte is searched once and consumed events are cut off the front, so an
event costs time linear in its size, and one event larger than ``max_event_bytes`` is an error
rather than unbounded memory.

``upstream_chunks`` is the one loop over an upstream's stream that both relays use (an ordinary
stream, ``rllm.gateway.streaming``, and one continued across weight syncs,
``rllm.gateway.partial_stream``): each event's data up to ``[DONE]``, decoded by ``decode_chunk``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterable
from typing import Any

import msgspec

from rllm.types.errors import RLLMError

_json_decode = msgspec.json.Decoder().decode


class EventTooLarge(RLLMError, ValueError):
    """One event outgrew ``max_event_bytes``."""


def sse_data(event: bytes) -> bytes | None:
    """The data of one SSE event (lines joined), or None for comments/empty events."""
    data = None
    for line in event.split(b"\n"):
        line = line.rstrip(b"\r")
        if line.startswith(b"data:"):
            part = line[5:]
            if part.startswith(b" "):
                part = part[1:]
            data = part if data is None else data + b"\n" + part
    return data


class SseEvents:
    """``feed(piece)`` returns the data of each event the piece completed, in order."""

    __slots__ = ("_buf", "_scanned", "max_event_bytes")

    def __init__(self, max_event_bytes: int) -> None:
        self.max_event_bytes = max_event_bytes
        self._buf = bytearray()
        self._scanned = 0  # bytes of _buf already searched for an event's end

    def feed(self, piece: bytes) -> list[bytes]:
        buf = self._buf
        buf += piece
        out: list[bytes] = []
        start = 0
        while True:
            # -1: the blank line's first "\n" may be the last byte searched before
            end = buf.find(b"\n\n", max(start, self._scanned - 1))
            if end < 0:
                break
            payload = sse_data(bytes(buf[start:end]))
            start = self._scanned = end + 2
            if payload is not None:
                out.append(payload)
        if start:
            del buf[:start]  # cheap: a bytearray drops its front without moving the rest
        self._scanned = len(buf)
        if len(buf) > self.max_event_bytes:
            raise EventTooLarge(
                f"upstream stream event exceeds max_stream_event_bytes ({self.max_event_bytes} bytes)"
            )
        return out


class StreamFault(RLLMError):
    """What the gateway cannot take from an upstream's stream (the message says what)."""


async def upstream_chunks(pieces: AsyncIterable[bytes], max_event_bytes: int) -> AsyncGenerator[bytes]:
    """The data of each event of an upstream's stream (``pieces``: its body as it arrives), up
    to ``[DONE]``. Raises StreamFault for an event larger than ``max_event_bytes`` and for a
    stream that ends before ``[DONE]``. Iterate it under ``contextlib.aclosing``: a relay that
    stops early (the client went away) then closes it at once."""
    events = SseEvents(max_event_bytes)
    async for piece in pieces:
        try:
            payloads = events.feed(piece)
        except EventTooLarge as exc:
            raise StreamFault(str(exc)) from None
        for payload in payloads:
            if payload == b"[DONE]":
                return
            yield payload
    raise StreamFault("upstream closed the stream before [DONE]")


def decode_chunk(payload: bytes) -> dict[str, Any]:
    """One event's data as the JSON object a chunk is; StreamFault for anything else."""
    try:
        chunk = _json_decode(payload)
    except (msgspec.DecodeError, RecursionError):
        raise StreamFault("upstream sent a stream event that is not JSON") from None
    if not isinstance(chunk, dict):
        raise StreamFault(f"upstream sent a stream event that is a JSON {type(chunk).__name__}")
    return chunk


__all__ = ["EventTooLarge", "SseEvents", "StreamFault", "decode_chunk", "sse_data", "upstream_chunks"]
