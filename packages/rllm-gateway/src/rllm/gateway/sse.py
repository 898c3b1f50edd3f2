"""Server-sent events from an upstream's stream: split into events as the bytes arrive.

Pieces arrive in whatever sizes the network gives. Joining them into one growing buffer and
searching it from the start each time costs quadratic time in the size of an event that spans
many pieces; here each byte is searched once and consumed events are cut off the front, so an
event costs time linear in its size, and one event larger than ``max_event_bytes`` is an error
rather than unbounded memory.
"""

from __future__ import annotations

from rllm.types.errors import RLLMError


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


__all__ = ["EventTooLarge", "SseEvents", "sse_data"]
