"""A lean HTTP/1.1 keep-alive client for whole (non-streaming) request/response exchanges.

The general-purpose aiohttp client spends most of its per-request CPU on features a loopback
JSON call does not need (cookies, redirects, tracing hooks, multidict headers). This client
writes one pre-formatted request and parses only the status line, Content-Length / chunked
framing and Connection: close. The gateway forwards with it; the engine's GatewayClient makes
its admin calls with it. Streaming responses still use aiohttp.
"""

from __future__ import annotations

import asyncio
from collections import deque
from urllib.parse import urlsplit


class UpstreamConnectError(ConnectionError):
    """Could not open a connection (the worker is down)."""


class UpstreamDropped(ConnectionError):
    """The connection closed before a whole response arrived."""


class _Conn(asyncio.Protocol):
    __slots__ = ("buf", "closed", "timed_out", "transport", "waiter")

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.waiter: asyncio.Future[None] | None = None
        self.closed = False
        self.timed_out = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def time_out(self) -> None:
        """Read deadline passed: wake the reader, which then raises TimeoutError."""
        self.timed_out = True
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def wait_data(self) -> None:
        if self.timed_out:
            raise TimeoutError
        self.waiter = asyncio.get_running_loop().create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None
        if self.timed_out:
            raise TimeoutError


class FastHttpPool:
    """Keep-alive connections per (host, port); ``request``/``post`` return (status, body)."""

    def __init__(self, *, connect_timeout_s: float, read_timeout_s: float, max_idle: int = 1024) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.max_idle = max_idle
        self._idle: dict[tuple[str, int], deque[_Conn]] = {}
        # (origin, content type, extra headers) -> ((host, port), the head's lines after the
        # request line, up to "Content-Length: "): formatted once per upstream or gateway.
        self._heads: dict[tuple[str, str, bytes], tuple[tuple[str, int], bytes]] = {}

    async def _connect(self, host: str, port: int) -> _Conn:
        loop = asyncio.get_running_loop()
        try:
            _, proto = await asyncio.wait_for(
                loop.create_connection(_Conn, host, port), self.connect_timeout_s
            )
        except (OSError, TimeoutError) as exc:
            raise UpstreamConnectError(f"cannot connect to {host}:{port}: {exc}") from None
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
        if not url.startswith("http://"):
            raise ValueError("FastHttpPool speaks plain http only")
        cut = url.find("/", 7)  # origin | request target; admin targets differ per session
        origin, target = (url, "/") if cut < 0 else (url[:cut], url[cut:])
        shape = (origin, content_type, headers)
        cached = self._heads.get(shape)
        if cached is None:
            cached = self._parse(shape)
        key, tail = cached
        head = b"%s %s HTTP/1.1\r\n%s%d\r\n\r\n" % (
            method.encode("latin-1"),
            target.encode("latin-1"),
            tail,
            len(body),
        )
        idle = self._idle.get(key)
        if idle is None:
            idle = self._idle[key] = deque()
        while idle:
            conn = idle.pop()
            if conn.closed:
                continue
            try:
                return await self._exchange(key, conn, head, body)
            except UpstreamDropped:
                continue  # stale keep-alive connection; try another / a fresh one
        conn = await self._connect(*key)
        return await self._exchange(key, conn, head, body)

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

    async def _exchange(
        self, key: tuple[str, int], conn: _Conn, head: bytes, body: bytes
    ) -> tuple[int, bytes]:
        assert conn.transport is not None
        conn.buf.clear()
        conn.transport.write(head + body)
        # A plain timer handle, not asyncio.timeout/wait_for: those cost a Timeout object (or a
        # Task) per request; the handle just wakes the reader, which raises TimeoutError.
        timer = asyncio.get_running_loop().call_later(self.read_timeout_s, conn.time_out)
        try:
            status, payload, keep = await self._read_response(conn)
        except BaseException:
            conn.transport.abort()
            raise
        finally:
            timer.cancel()
        if keep and not conn.closed and len(self._idle[key]) < self.max_idle:
            self._idle[key].append(conn)
        else:
            conn.transport.close()
        return status, payload

    async def _read_response(self, conn: _Conn) -> tuple[int, bytes, bool]:
        buf = conn.buf
        while True:
            end = buf.find(b"\r\n\r\n")
            if end >= 0:
                break
            if conn.closed:
                raise UpstreamDropped("connection closed before the response headers")
            await conn.wait_data()
        lines = bytes(buf[:end]).split(b"\r\n")
        del buf[: end + 4]
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
                length = int(value.strip())
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection":
                v = value.strip().lower()
                keep = v != b"close" and (keep or v == b"keep-alive")
        if chunked:
            return status, await self._read_chunked(conn), keep
        if length < 0:  # body runs to the end of the connection
            while not conn.closed:
                await conn.wait_data()
            return status, bytes(buf), False
        while len(buf) < length:
            if conn.closed:
                raise UpstreamDropped("connection closed mid-body")
            await conn.wait_data()
        payload = bytes(buf[:length])
        del buf[:length]
        return status, payload, keep

    async def _read_chunked(self, conn: _Conn) -> bytes:
        buf = conn.buf
        out = bytearray()
        while True:
            while (nl := buf.find(b"\r\n")) < 0:
                if conn.closed:
                    raise UpstreamDropped("connection closed mid-chunk")
                await conn.wait_data()
            size = int(bytes(buf[:nl]).split(b";")[0], 16)
            while len(buf) < nl + 2 + size + 2:
                if conn.closed:
                    raise UpstreamDropped("connection closed mid-chunk")
                await conn.wait_data()
            out += buf[nl + 2 : nl + 2 + size]
            del buf[: nl + 2 + size + 2]
            if size == 0:
                return bytes(out)

    def close(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                if conn.transport is not None:
                    conn.transport.close()
        self._idle.clear()
