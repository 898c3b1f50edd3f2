"""The reading half of the lean HTTP/1.1 server's connection: bytes in, requests queued.

:class:`RequestReader` is the httptools parser's callback object. It bounds a request's head and
body, queues whole requests behind the one being answered (pipelining), holds reading back while
too much is queued, and turns unreadable input into a final answer. Answering the queued
requests is :class:`rllm.runtime.http_server.HttpProtocol`'s, a subclass: one object per
connection, so a request costs no call between the halves beyond the parser's own callbacks.
"""

from __future__ import annotations

import asyncio
from collections import deque

import httptools

from rllm.runtime.http_messages import ErrorFactory, Headers, Pending, Response

MAX_PIPELINED = 32  # queued requests per connection before we stop reading from it
MAX_HEAD_BYTES = 64 * 1024  # request line + headers; more is refused with 431

# A whole request waiting to be answered: method, path, query, headers, body, keep-alive, and
# whether its body was over the limit (then it was not kept, and the answer is a 413).
Queued = tuple[str, str, str, Headers, bytes, bool, bool]


class _Refused(Exception):
    """Stops the parser after a request was refused from its headers alone."""


class _HeadTooLarge(Exception):
    """A request's line and headers outgrew MAX_HEAD_BYTES (a slow-headers attack or a bug)."""


class RequestReader(asyncio.Protocol):
    """Parses a connection's bytes into queued requests, which the subclass answers in order.

    Between the halves: ``_queue`` (a request's method, path, query, headers, body, keep-alive
    and whether its body was too big), ``_task`` (what answers the current request: set and
    cleared by the answering half) and ``_final`` (the answer to unreadable input). The answering
    half provides ``_next`` (answer the first queued request), ``_finish_connection`` (send
    ``_final`` and close) and ``write``."""

    def __init__(self, max_body_bytes: int, max_pipelined_bytes: int, error_factory: ErrorFactory) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self._max_body_bytes = max_body_bytes
        self._max_pipelined_bytes = max_pipelined_bytes
        self._error_factory = error_factory
        self._queue: deque[Queued] = deque()
        self._queued_bytes = 0  # bodies held in _queue (the one arriving is _size)
        self._task: asyncio.Task[None] | Pending | None = None
        # Malformed input after requests still being answered: their answers go out whole and in
        # order first, then this one, then the connection closes.
        self._final: Response | None = None
        self._reading_paused = False
        # per-message parse state
        self._url = b""
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._size = 0
        self._too_big = False
        self._head_bytes = 0

    # ---------------------------------------------------------------- the answering half's
    def _next(self) -> None:
        raise NotImplementedError

    def _finish_connection(self) -> None:
        raise NotImplementedError

    def write(self, data: bytes | memoryview) -> None:
        raise NotImplementedError

    def idle(self) -> bool:
        return self._task is None and not self._queue

    def _too_big_message(self) -> str:
        return f"request body exceeds the gateway's limit of {self._max_body_bytes} bytes"

    # ---------------------------------------------------------------- bytes in
    def data_received(self, data: bytes) -> None:
        if self._final is not None:
            return  # the parser failed already; nothing after it can be read
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(400, "protocol upgrades are not supported")
        except httptools.HttpParserError as exc:
            if self._final is not None:
                pass  # a callback refused the request and queued its answer (_Refused)
            elif self._head_bytes > MAX_HEAD_BYTES:  # httptools wraps our _HeadTooLarge
                self._fail(431, f"request line and headers exceed {MAX_HEAD_BYTES} bytes")
            else:
                self._fail(400, f"malformed HTTP request: {exc}")

    def _fail(self, status: int, message: str) -> None:
        """Answer unreadable input and close, once every request before it was answered."""
        self._final = self._error_factory(status, message)
        if self.transport is not None and not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()
        if self.idle():
            self._finish_connection()

    # ---------------------------------------------------------------- parser callbacks
    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = {}
        self._body = []
        self._size = 0
        self._too_big = False
        self._head_bytes = 0

    def _count_head(self, n: int) -> None:
        self._head_bytes += n
        if self._head_bytes > MAX_HEAD_BYTES:
            raise _HeadTooLarge  # stops the parser; data_received answers 431

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value))
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        length = self._headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self._max_body_bytes:
            self._too_big = True
            if self._headers.get("expect", "").lower() == "100-continue":
                # The client waits for a go-ahead before sending the body: refuse it now rather
                # than let it wait (or send a body we would only discard).
                self._fail(413, self._too_big_message())
                raise _Refused
        elif self._headers.get("expect", "").lower() == "100-continue":
            self.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        if self._too_big:
            return
        self._size += len(body)
        if self._size > self._max_body_bytes:
            self._too_big = True
            self._body = []
            return
        self._body.append(body)
        if (
            not self._reading_paused
            and not self.idle()
            and self._queued_bytes + self._size > self._max_pipelined_bytes
        ):
            # A body behind a request still being answered counts against the cap while it
            # arrives, not only once whole: stop reading now (within one read of the cap).
            self._pause_reading()

    def on_message_complete(self) -> None:
        if self._final is not None:
            return
        url = httptools.parse_url(self._url)
        # Percent-escapes stay as sent: the router decodes each matched segment, so an escaped
        # "/" (%2F) can never change which route a path takes.
        path = url.path.decode("latin-1")
        method = self.parser.get_method().decode("latin-1")
        # The pieces go as they are joined, so a finished body is never held twice for long.
        pieces, self._body, self._size = self._body, [], 0
        body = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        del pieces
        query = (url.query or b"").decode("latin-1")
        keep_alive = self.parser.should_keep_alive()
        self._queue.append((method, path, query, Headers(self._headers), body, keep_alive, self._too_big))
        self._queued_bytes += len(body)
        if self._task is None:
            self._next()
        elif (
            len(self._queue) > MAX_PIPELINED or self._queued_bytes > self._max_pipelined_bytes
        ) and not self._reading_paused:
            self._pause_reading()

    # ---------------------------------------------------------------- read back-pressure
    def _pause_reading(self) -> None:
        """Back-pressure, not an error: the client's writes wait until earlier answers went out."""
        self._reading_paused = True
        self.transport.pause_reading()  # type: ignore[union-attr]

    def _resume_reading_if_room(self) -> None:
        """Go on reading once what is held behind the request being answered (queued bodies and
        the one arriving) fell to half the caps, or once nothing is being answered (then the
        arriving body is the next request, bounded by max_body_bytes alone)."""
        if self._final is not None:
            return
        held = self._queued_bytes + (0 if self._too_big else self._size)  # a refused body is not kept
        if self.idle() or (len(self._queue) <= MAX_PIPELINED // 2 and held <= self._max_pipelined_bytes // 2):
            self._reading_paused = False
            self.transport.resume_reading()  # type: ignore[union-attr]
