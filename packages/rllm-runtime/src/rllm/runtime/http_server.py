"""A lean HTTP/1.1 server: an asyncio Protocol around the httptools parser.

Why not aiohttp's server: on a proxy's hot path its request objects, URL dispatcher, middleware
chain and response machinery cost about a fifth of the CPU per request. This server does what the
gateway and the mock upstream need and no more: whole request bodies (size-limited), keep-alive
and pipelining, ``Expect: 100-continue``, one write per plain response (a body over 1 MiB goes in
slices as the client reads it), chunked streaming responses with write back-pressure,
cancellation of the handler when the client goes away, idle connection reaping and a graceful
shutdown. Reading a connection's requests is :mod:`rllm.runtime.http_reading`'s, the request and
response objects are in :mod:`rllm.runtime.http_messages`, the router in
:mod:`rllm.runtime.http_router`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import socket
import time
from collections.abc import Awaitable
from email.utils import formatdate

from rllm.runtime.http_messages import (
    EarlyHandler,
    ErrorFactory,
    Handler,
    Request,
    Response,
    StreamResponse,
    status_line,
)
from rllm.runtime.http_reading import RequestReader

log = logging.getLogger("rllm.runtime.http")

_WRITE_SLICE = 1 << 20  # a response body larger than this is written a slice at a time


class _DateCache:
    """The Date header, formatted once a second rather than once a response."""

    __slots__ = ("_line", "_second")

    def __init__(self) -> None:
        self._second = -1
        self._line = b""

    def line(self) -> bytes:
        now = int(time.time())
        if now != self._second:
            self._second = now
            self._line = f"Date: {formatdate(now, usegmt=True)}\r\n".encode()
        return self._line


class HttpProtocol(RequestReader):
    """One client connection. Requests are answered in order, one at a time: by a handler
    task, at once, or by whoever holds the Pending an early handler returned. Reading them is
    :class:`RequestReader`'s; this half answers them and owns the transport's write side."""

    def __init__(self, server: HttpServer) -> None:
        super().__init__(server.max_body_bytes, server.max_pipelined_bytes, server.error_factory)
        self.server = server
        self.closed = False
        self.paused: asyncio.Future[None] | None = None
        self.last_active = 0.0
        self.stream_open = False  # a chunked response head went out and its end has not
        self._keep_alive = True  # of the request being answered

    # ---------------------------------------------------------------- transport events
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.last_active = self.server.loop.time()
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        self._queue.clear()
        if self._task is not None:
            self._task.cancel()  # the client is gone: stop its upstream call (streams leave "abort")
        if self.paused is not None and not self.paused.done():
            self.paused.set_result(None)

    def pause_writing(self) -> None:
        if self.paused is None:
            self.paused = self.server.loop.create_future()

    def resume_writing(self) -> None:
        p, self.paused = self.paused, None
        if p is not None and not p.done():
            p.set_result(None)

    async def drain(self) -> None:
        p = self.paused
        if p is not None:
            await p
        if self.closed:
            raise ConnectionResetError("client disconnected")

    def write(self, data: bytes | memoryview) -> None:
        if not self.closed:
            self.transport.write(data)  # type: ignore[union-attr]

    def close(self) -> None:
        if not self.closed and self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        # Marked closed at once, not when connection_lost runs on the next loop pass, so that the
        # handler's return writes nothing (no answer, no closing chunk) to the dead transport.
        if not self.closed and self.transport is not None:
            self.closed = True
            self.transport.abort()

    @property
    def handler(self) -> asyncio.Task[None] | None:
        """The task answering the current request, if one is."""
        task = self._task
        return task if isinstance(task, asyncio.Task) else None

    def _finish_connection(self) -> None:
        final, self._final = self._final, None
        if final is not None and not self.closed:
            self._final = final  # keeps data_received ignoring input until the close lands
            self._write_response(final, keep_alive=False)
        self.close()

    # ---------------------------------------------------------------- answering
    def _next(self) -> None:
        method, path, query, headers, body, keep_alive, too_big = self._queue.popleft()
        self._queued_bytes -= len(body)
        if self._reading_paused:
            self._resume_reading_if_room()
        self._keep_alive = keep_alive
        req = Request(self, method, path, query, headers, body)
        server = self.server
        if too_big:
            self.respond(req, server.error_factory(413, self._too_big_message()))
            return
        started = None
        if server.early is not None:
            try:
                started = server.early(req)
            except Exception as exc:  # the early handler maps errors itself; last line of defence
                started = self._internal_error(req, exc)
        if started is None:
            started = server.dispatch(req)
        if isinstance(started, Response):
            self.respond(req, started)
        elif inspect.isawaitable(started):
            self.answer_in_task(req, started)
        else:
            self._task = started

    def answer_in_task(self, req: Request, answer: Awaitable[Response | StreamResponse]) -> None:
        self._task = self.server.loop.create_task(self._answer(req, answer))

    async def _answer(self, req: Request, answer: Awaitable[Response | StreamResponse]) -> None:
        try:
            resp = await answer
        except (asyncio.CancelledError, ConnectionResetError):
            self._task = None  # the client went away mid-request
            self.close()
            return
        except Exception as exc:  # dispatch maps errors itself; this is the last line of defence
            resp = self._internal_error(req, exc)
        self._task = None
        if self.closed:
            return
        if self.stream_open:
            self.stream_open = False
            if isinstance(resp, StreamResponse) and resp.prepared:
                self.write(b"0\r\n\r\n")
                self._done()
            else:
                # The handler failed after its stream began: no status can be sent any more, so
                # end the connection and let the client see a truncated stream.
                self.close()
            return
        if isinstance(resp, StreamResponse):
            resp = Response(status=resp.status, headers=resp.headers)
        self.respond(req, resp)

    def _internal_error(self, req: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", req.method, req.path, exc_info=exc)
        return self.server.error_factory(500, f"internal gateway error: {type(exc).__name__}")

    def respond(self, req: Request, resp: Response) -> None:
        """Send the whole answer to the current request, then go on to the next one."""
        self._task = None
        if self.closed:
            return
        with_body = req.method != "HEAD"
        if with_body and len(resp.body) > _WRITE_SLICE:
            # A large body goes out in slices as the client reads it: handed to the transport
            # whole, it would be copied (once or twice, by the loop) into the transport's buffer.
            self._write_response(resp, self._keep_alive, with_body=False)
            self._task = self.server.loop.create_task(self._write_body(resp.body))
            return
        self._write_response(resp, self._keep_alive, with_body=with_body)
        self._done()

    async def _write_body(self, body: bytes) -> None:
        """The body of a large answer, one slice per drained write; then the next request."""
        with memoryview(body) as view:
            for start in range(0, len(view), _WRITE_SLICE):
                try:
                    await self.drain()
                except ConnectionResetError:
                    self._task = None  # the client went away; connection_lost cleaned up
                    return
                self.write(view[start : start + _WRITE_SLICE])
        self._task = None
        self._done()

    def _done(self) -> None:
        self.last_active = self.server.loop.time()
        if not self._keep_alive:
            self.close()
        elif self._queue:
            self._next()
        elif self._final is not None:
            self._finish_connection()
        elif self._reading_paused:
            self._resume_reading_if_room()  # a body paused mid-way is now the next request

    def _write_response(self, resp: Response, keep_alive: bool, with_body: bool = True) -> None:
        head = status_line(resp.status)
        extra = ""
        if resp.headers:
            extra = "".join(f"{k}: {v}\r\n" for k, v in resp.headers.items() if k.lower() != "content-type")
            ctype = resp.headers.get("Content-Type", resp.content_type)
        else:
            ctype = resp.content_type
        tail = "" if keep_alive else "Connection: close\r\n"
        self.write(
            head
            + self.server.date.line()
            + f"Content-Type: {ctype}\r\nContent-Length: {len(resp.body)}\r\n{extra}{tail}\r\n".encode(
                "latin-1"
            )
            + (resp.body if with_body else b"")
        )


class HttpServer:
    """Listen on a socket and answer every request with ``dispatch(request)``.

    ``dispatch`` owns routing and error mapping; ``error_factory(status, message)`` builds the
    responses the server itself sends (malformed HTTP, body too large, unhandled errors).
    ``early(request)``, if given, sees each request first, in the I/O callback that completed
    it (see EarlyHandler): a request it answers or keeps costs no task and no extra loop pass.
    """

    def __init__(
        self,
        dispatch: Handler,
        error_factory: ErrorFactory,
        *,
        max_body_bytes: int,
        max_pipelined_bytes: int | None = None,
        keepalive_timeout_s: float = 75.0,
        early: EarlyHandler | None = None,
    ) -> None:
        self.dispatch = dispatch
        self.early = early
        self.error_factory = error_factory
        self.max_body_bytes = max_body_bytes
        # Bodies queued behind the request being answered, per connection, the one arriving
        # included: reading pauses as soon as they pass it.
        self.max_pipelined_bytes = (
            max_pipelined_bytes if max_pipelined_bytes is not None else 2 * max_body_bytes
        )
        self.keepalive_timeout_s = keepalive_timeout_s
        self.connections: set[HttpProtocol] = set()
        self.date = _DateCache()
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment] - set in start()
        self._server: asyncio.AbstractServer | None = None
        self._reaper: asyncio.Task[None] | None = None

    async def start(self, sock: socket.socket, backlog: int = 4096) -> None:
        self.loop = asyncio.get_running_loop()
        self._server = await self.loop.create_server(lambda: HttpProtocol(self), sock=sock, backlog=backlog)
        self._reaper = self.loop.create_task(self._reap_idle())

    async def _reap_idle(self) -> None:
        """Close kept-alive connections idle for longer than the keep-alive timeout."""
        interval = max(0.5, min(15.0, self.keepalive_timeout_s / 2))
        while True:
            await asyncio.sleep(interval)
            cutoff = self.loop.time() - self.keepalive_timeout_s
            for conn in [c for c in self.connections if c.idle() and c.last_active < cutoff]:
                conn.close()

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Stop listening, let in-flight requests finish for up to ``timeout_s``, then close all."""
        if self._server is None:
            return
        self._server.close()
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        deadline = self.loop.time() + timeout_s
        while self.loop.time() < deadline:
            for conn in [c for c in self.connections if c.idle()]:
                conn.close()
            if not self.connections:
                break
            await asyncio.sleep(0.02)
        handlers = [c.handler for c in self.connections if c.handler is not None]
        for conn in list(self.connections):
            conn.close()  # connection_lost cancels a handler still going
        if handlers:  # let them finish their cleanup (an aborted trace is still stored)
            await asyncio.wait(handlers, timeout=timeout_s)
