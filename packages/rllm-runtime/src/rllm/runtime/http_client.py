"""A lean HTTP/1.1 keep-alive client for whole (non-streaming) request/response exchanges.

The general-purpose aiohttp client spends most of its per-request CPU on features a loopback
JSON call does not need (cookies, redirects, tracing hooks, multidict headers). This client
writes one pre-formatted request and parses only the status line, Content-Length / chunked
framing and Connection: close. The gateway forwards with it; the engine's GatewayClient makes
its admin calls with it. Streaming responses still use aiohttp.

Two ways to use it: ``await post(...)``, or ``send_nowait(...)``, which writes the request on a
kept-alive connection at once and hands the answer to a callback from the connection's own I/O
callback. The second costs no task and no event-loop pass between the answer arriving and the
callback running: the gateway's proxy lane uses it so that a call's answer is written back to
its client in the same pass as it arrives.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from urllib.parse import urlsplit

from rllm.types.errors import DeadlineError, InputError, RLLMError


class UpstreamConnectError(RLLMError, ConnectionError):
    """Could not open a connection (the worker is down)."""


class UpstreamDropped(RLLMError, ConnectionError):
    """The connection closed before a whole response arrived."""


class UpstreamBadResponse(RLLMError):
    """The upstream framed its answer wrongly (a bad Content-Length or chunk size) or sent more
    than the size limit. Not a connection error: retrying would not help, so it is a 502."""


class UpstreamTooLarge(UpstreamBadResponse):
    """The answer is larger than the pool's ``max_body_bytes`` (announced so, or sent so)."""


class UpstreamTooSlow(RLLMError, TimeoutError):
    """An answer that had started did not finish within the pool's ``answer_timeout_s`` (it
    stalled mid-way, or trickled)."""


Answer = tuple[int, bytes]  # status, body
Outcome = Answer | BaseException  # what a send_nowait callback receives
OnAnswer = Callable[[Outcome], None]


_MAX_HEAD = 64 * 1024


def parse_response(
    buf: bytearray, closed: bool, max_body: int | None = None
) -> tuple[int, bytes, bool] | None:
    """Take one whole response off the front of ``buf``: (status, body, keep-alive), or None
    while more bytes are needed. ``closed``: no more bytes will come, so a body without a length
    ends here and anything short is an error (UpstreamDropped). Bad framing, or a body larger
    than ``max_body``, raises UpstreamBadResponse."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        if len(buf) > _MAX_HEAD:
            raise UpstreamBadResponse(f"response headers exceed {_MAX_HEAD} bytes")
        if closed:
            raise UpstreamDropped("connection closed before the response headers")
        return None
    lines = bytes(buf[:end]).split(b"\r\n")
    try:
        status = int(lines[0].split(b" ", 2)[1])
    except (IndexError, ValueError):
        raise UpstreamDropped(f"malformed status line {lines[0][:80]!r}") from None
    length = -1
    chunked = False
    keep = lines[0].startswith(b"HTTP/1.1")
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            v = value.strip()
            if not v.isdigit() or (length >= 0 and int(v) != length):
                raise UpstreamBadResponse(f"bad Content-Length {bytes(v[:40])!r}")
            length = int(v)
        elif name == b"transfer-encoding":
            chunked = b"chunked" in value.lower()
        elif name == b"connection":
            v = value.strip().lower()
            keep = v != b"close" and (keep or v == b"keep-alive")
    start = end + 4
    if max_body is not None and (length > max_body or len(buf) - start > max_body + 4096):
        size = length if length > max_body else len(buf) - start
        raise UpstreamTooLarge(f"upstream answer of {size}+ bytes exceeds the limit of {max_body}")
    if chunked:
        # The last chunk ends in an empty line: until the buffer does, it cannot be whole.
        whole = _dechunk(buf, start) if buf.endswith(b"\r\n\r\n") else None
        if whole is None:
            if closed:
                raise UpstreamDropped("connection closed mid-chunk")
            return None
        body, stop = whole
    elif length < 0:  # the body runs to the end of the connection
        if not closed:
            return None
        body, stop, keep = _copy(buf, start, len(buf)), len(buf), False
    else:
        stop = start + length
        if len(buf) < stop:
            if closed:
                raise UpstreamDropped("connection closed mid-body")
            return None
        body = _copy(buf, start, stop)
    del buf[:stop]  # frees the buffer's memory when that was the whole of it (the usual case)
    return status, body, keep


def _copy(buf: bytearray, start: int, stop: int) -> bytes:
    """``buf[start:stop]`` as bytes, a large one in one copy (slicing the bytearray first makes
    two; for a small one that is the quicker way)."""
    if stop - start < 1 << 16:
        return bytes(buf[start:stop])
    with memoryview(buf) as view:
        return view[start:stop].tobytes()


def _dechunk(buf: bytearray, pos: int) -> tuple[bytes, int] | None:
    """The body of a chunked message starting at ``pos`` and where it ends, or None if short."""
    out = bytearray()
    while True:
        nl = buf.find(b"\r\n", pos)
        if nl < 0:
            return None
        field = bytes(buf[pos:nl]).split(b";")[0].strip()
        if not field or len(field) > 15 or field.strip(b"0123456789abcdefABCDEF"):
            raise UpstreamBadResponse(f"bad chunk size {field[:40]!r}")
        size = int(field, 16)
        data = nl + 2
        if size == 0:
            trailer_end = buf.find(b"\r\n\r\n", nl)  # the terminating chunk's (empty) trailer
            return (bytes(out), trailer_end + 4) if trailer_end >= 0 else None
        if len(buf) < data + size + 2:
            return None
        with memoryview(buf) as view:
            out += view[data : data + size]
        pos = data + size + 2


class _Conn(asyncio.Protocol):
    """One kept-alive connection: awaited with ``wait_data``, or in callback mode while
    ``on_answer`` is set (a ``send_nowait`` exchange)."""

    __slots__ = ("buf", "closed", "key", "on_answer", "pool", "timed_out", "timer", "transport", "waiter")

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.waiter: asyncio.Future[None] | None = None
        self.closed = False
        self.timed_out = False
        self.on_answer: OnAnswer | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.pool: FastHttpPool | None = None
        self.key: tuple[str, int] = ("", 0)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.on_answer is not None:
            self._deliver()
            return
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.on_answer is not None:
            self._deliver()
            return
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def time_out(self) -> None:
        """Read deadline passed: wake the reader (which raises TimeoutError), or fail the callback."""
        self.timed_out = True
        if self.on_answer is not None:
            self._settle(TimeoutError())
            return
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _deliver(self) -> None:
        try:
            parsed = parse_response(self.buf, self.closed, self.pool.max_body_bytes if self.pool else None)
        except (UpstreamDropped, UpstreamBadResponse) as exc:
            self._settle(exc)
            return
        if parsed is not None:
            self._settle(parsed)

    def _settle(self, outcome: tuple[int, bytes, bool] | BaseException) -> None:
        callback, self.on_answer = self.on_answer, None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if isinstance(outcome, tuple):
            status, body, keep = outcome
            if keep and not self.closed and self.pool is not None:
                self.pool.release(self)
            else:
                self.transport.close()  # type: ignore[union-attr]
            assert callback is not None
            callback((status, body))
        else:
            self.transport.abort()  # type: ignore[union-attr]
            assert callback is not None
            callback(outcome)

    def cancel(self) -> None:
        """Give up on a ``send_nowait`` exchange: its callback is not called; the connection,
        whose answer may still arrive, is dropped."""
        if self.on_answer is None:
            return
        self.on_answer = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.transport.abort()  # type: ignore[union-attr]

    async def wait_data(self) -> None:
        if self.timed_out:
            raise DeadlineError
        self.waiter = asyncio.get_running_loop().create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None
        if self.timed_out:
            raise DeadlineError


Connection = _Conn  # what send_nowait returns: the exchange's handle (``cancel()``)


class FastHttpPool:
    """Keep-alive connections per (host, port); ``request``/``post`` return (status, body),
    ``send_nowait`` hands it to a callback."""

    def __init__(
        self,
        *,
        connect_timeout_s: float,
        read_timeout_s: float,
        max_idle: int = 1024,
        max_body_bytes: int | None = None,
        answer_timeout_s: float | None = None,
    ) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.max_body_bytes = max_body_bytes
        self.read_timeout_s = read_timeout_s
        # ``request``/``post`` only: once an answer's first byte is in, the rest must follow within
        # this (UpstreamTooSlow), whatever ``read_timeout_s`` still allows.
        self.answer_timeout_s = answer_timeout_s
        self.max_idle = max_idle
        self._idle: dict[tuple[str, int], deque[_Conn]] = {}
        # (origin, content type, extra headers) -> ((host, port), the head's lines after the
        # request line, up to "Content-Length: "): formatted once per upstream or gateway.
        self._heads: dict[tuple[str, str, bytes], tuple[tuple[str, int], bytes]] = {}

    async def _connect(self, key: tuple[str, int]) -> _Conn:
        loop = asyncio.get_running_loop()
        try:
            _, proto = await asyncio.wait_for(loop.create_connection(_Conn, *key), self.connect_timeout_s)
        except (OSError, TimeoutError) as exc:
            raise UpstreamConnectError(f"cannot connect to {key[0]}:{key[1]}: {exc}") from None
        proto.pool, proto.key = self, key
        return proto

    async def post(self, url: str, body: bytes, content_type: str = "application/json") -> tuple[int, bytes]:
        """POST ``body``; retries on a fresh connection if a reused one was already closed."""
        return await self.request("POST", url, body, content_type=content_type)

    async def request(
        self,
        method: str,
        url: str,
        body: bytes = b"",
        *,
        content_type: str = "application/json",
        headers: bytes = b"",
    ) -> tuple[int, bytes]:
        """One exchange; ``headers`` are preformatted ``Name: value\\r\\n`` lines."""
        key, head = self._head(method, url, len(body), content_type, headers)
        while (conn := self._take_idle(key)) is not None:
            try:
                return await self._exchange(conn, head, body)
            except UpstreamDropped:
                continue  # stale keep-alive connection; try another / a fresh one
        return await self._exchange(await self._connect(key), head, body)

    def send_nowait(self, url: str, body: bytes, on_answer: OnAnswer) -> _Conn | None:
        """POST ``body`` (JSON) on an idle kept-alive connection now; None when none is idle
        (then use ``post``, which may connect). ``on_answer`` is called once, later, from the
        connection's I/O callback, with (status, body) or the error that ended the exchange
        (UpstreamDropped, TimeoutError). The returned handle's ``cancel()`` gives up on it."""
        key, head = self._head("POST", url, len(body), "application/json", b"")
        conn = self._take_idle(key)
        if conn is None:
            return None
        conn.buf.clear()
        conn.on_answer = on_answer
        conn.transport.write(head + body)  # type: ignore[union-attr]
        conn.timer = asyncio.get_running_loop().call_later(self.read_timeout_s, conn.time_out)
        return conn

    def _head(
        self, method: str, url: str, length: int, content_type: str, headers: bytes
    ) -> tuple[tuple[str, int], bytes]:
        if not url.startswith("http://"):
            raise InputError("FastHttpPool speaks plain http only")
        cut = url.find("/", 7)  # origin | request target; admin targets differ per session
        origin, target = (url, "/") if cut < 0 else (url[:cut], url[cut:])
        shape = (origin, content_type, headers)
        cached = self._heads.get(shape)
        if cached is None:
            cached = self._parse(shape)
        key, tail = cached
        return key, b"%s %s HTTP/1.1\r\n%s%d\r\n\r\n" % (
            method.encode("latin-1"),
            target.encode("latin-1"),
            tail,
            length,
        )

    def _take_idle(self, key: tuple[str, int]) -> _Conn | None:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            # is_closing: the peer's close was read but connection_lost has not run yet; a write
            # now would raise instead of failing over.
            if not conn.closed and conn.transport is not None and not conn.transport.is_closing():
                return conn
        return None

    def release(self, conn: _Conn) -> None:
        """A connection whose exchange ended cleanly goes back to the idle pool (or is closed)."""
        idle = self._idle.get(conn.key)
        if idle is None:
            idle = self._idle[conn.key] = deque()
        if len(idle) < self.max_idle:
            idle.append(conn)
        else:
            conn.transport.close()  # type: ignore[union-attr]

    def _parse(self, shape: tuple[str, str, bytes]) -> tuple[tuple[str, int], bytes]:
        origin, content_type, headers = shape
        parts = urlsplit(origin)
        tail = (
            f"Host: {parts.netloc}\r\n".encode("latin-1")
            + headers
            + f"Content-Type: {content_type}\r\nContent-Length: ".encode("latin-1")
        )
        entry = self._heads[shape] = ((parts.hostname or "127.0.0.1", parts.port or 80), tail)
        return entry

    async def _exchange(self, conn: _Conn, head: bytes, body: bytes) -> tuple[int, bytes]:
        assert conn.transport is not None
        conn.buf.clear()
        conn.transport.write(head + body)
        # A plain timer handle, not asyncio.timeout/wait_for: those cost a Timeout object (or a
        # Task) per request; the handle just wakes the reader, which raises TimeoutError.
        loop = asyncio.get_running_loop()
        timer = loop.call_later(self.read_timeout_s, conn.time_out)
        answer_timeout, answer_timer = self.answer_timeout_s, None
        try:
            while (parsed := parse_response(conn.buf, conn.closed, self.max_body_bytes)) is None:
                if answer_timeout is not None and answer_timer is None and conn.buf:
                    answer_timer = loop.call_later(answer_timeout, conn.time_out)  # its first byte
                await conn.wait_data()
        except BaseException as exc:
            conn.transport.abort()
            if (
                isinstance(exc, DeadlineError)
                and answer_timer is not None
                and answer_timer.when() <= loop.time()
            ):
                raise UpstreamTooSlow(
                    f"the answer did not finish within {answer_timeout:g} s of its first byte "
                    f"({len(conn.buf)} bytes had arrived)"
                ) from None
            raise
        finally:
            timer.cancel()
            if answer_timer is not None:
                answer_timer.cancel()
        status, payload, keep = parsed
        if keep and not conn.closed:
            self.release(conn)
        else:
            conn.transport.close()
        return status, payload

    def close(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                if conn.transport is not None:
                    conn.transport.close()
        self._idle.clear()
