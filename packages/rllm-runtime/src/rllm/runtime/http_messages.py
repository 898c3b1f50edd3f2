"""The lean HTTP/1.1 server's request and response objects, and the handler types.

:mod:`rllm.runtime.http_server` parses connections into these; handlers (the gateway, the mock
upstream) read a :class:`Request` and return a :class:`Response` or a :class:`StreamResponse`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import parse_qsl

from rllm.types.errors import StateError

if TYPE_CHECKING:
    from rllm.runtime.http_server import HttpProtocol

_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}


class Headers:
    """Case-insensitive, read-only request headers (the last value wins for repeated names)."""

    __slots__ = ("_items",)

    def __init__(self, items: dict[str, str]) -> None:
        self._items = items  # lower-cased names

    def get(self, name: str, default: Any = None) -> Any:
        return self._items.get(name.lower(), default)

    def __getitem__(self, name: str) -> str:
        return self._items[name.lower()]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._items


class Request:
    """One parsed request: method, path (percent-decoded), query, headers, body, route params."""

    __slots__ = ("_conn", "_query", "body", "headers", "match_info", "method", "path", "raw_query")

    def __init__(
        self,
        conn: HttpProtocol | None,
        method: str,
        path: str,
        raw_query: str,
        headers: Headers,
        body: bytes,
    ) -> None:
        self._conn = conn
        self._query: dict[str, str] | None = None
        self.method = method
        self.path = path
        self.raw_query = raw_query
        self.headers = headers
        self.body = body
        self.match_info: dict[str, str] = {}

    @property
    def query(self) -> dict[str, str]:
        """Query parameters; the first value wins for repeated names."""
        if self._query is None:
            q: dict[str, str] = {}
            for k, v in parse_qsl(self.raw_query, keep_blank_values=True):
                q.setdefault(k, v)
            self._query = q
        return self._query

    @property
    def can_read_body(self) -> bool:
        return bool(self.body)

    async def read(self) -> bytes:
        return self.body

    def respond(self, resp: Response) -> None:
        """Answer a request that ``HttpServer(early=...)`` kept (returned a Pending for)."""
        if self._conn is not None:
            self._conn.respond(self, resp)

    def respond_later(self, answer: Awaitable[Response | StreamResponse]) -> None:
        """Hand a kept request over to a task: it is answered with what ``answer`` returns."""
        if self._conn is not None:
            self._conn.answer_in_task(self, answer)

    def abort(self) -> None:
        """Drop the connection now, without an answer and without flushing what is queued.

        For servers that play a crashing peer (the mock upstream's "die" modes). The handler
        should return right after; whatever it returns is not sent.
        """
        if self._conn is not None:
            self._conn.abort()


class Response:
    """A whole response, written with its head in one transport write (a body over 1 MiB after
    its head, in slices as the client reads it)."""

    __slots__ = ("body", "content_type", "headers", "status")

    def __init__(
        self,
        *,
        status: int = 200,
        body: bytes = b"",
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
    ) -> None:
        self.status = status
        self.body = body
        self.content_type = content_type
        self.headers = headers


class StreamResponse:
    """A chunked response: ``await prepare(request)``, then ``await write(data)`` per piece.

    ``write`` waits while the client reads slower than we send, and raises ConnectionResetError
    once the client is gone. The server writes the closing chunk when the handler returns.
    """

    __slots__ = ("_conn", "headers", "status")

    def __init__(self, *, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self.status = status
        self.headers = headers or {}
        self._conn: HttpProtocol | None = None

    @property
    def prepared(self) -> bool:
        return self._conn is not None

    async def prepare(self, request: Request) -> StreamResponse:
        conn = request._conn
        if conn is None or conn.closed:
            raise ConnectionResetError("client disconnected")
        self._conn = conn
        conn.stream_open = True
        extra = "".join(f"{k}: {v}\r\n" for k, v in self.headers.items())
        conn.write(status_line(self.status) + f"{extra}Transfer-Encoding: chunked\r\n\r\n".encode("latin-1"))
        return self

    async def write(self, data: bytes) -> None:
        conn = self._conn
        if conn is None:
            raise StateError("StreamResponse.write before prepare")
        if not data:
            return
        if conn.closed:
            raise ConnectionResetError("client disconnected")
        conn.write(b"%x\r\n%b\r\n" % (len(data), data))
        if conn.paused is not None:
            await conn.drain()


Handler = Callable[[Request], Awaitable[Response | StreamResponse]]
ErrorFactory = Callable[[int, str], Response]


class Pending(Protocol):
    """A request being answered outside a task: ``cancel()`` when its client goes away."""

    def cancel(self) -> None: ...


# Runs in the connection's I/O callback, before any task: None (dispatch as usual), a Response
# (sent at once), an awaitable (answered by a task), or a Pending (the early handler calls
# ``request.respond`` or ``request.respond_later`` itself).
EarlyHandler = Callable[[Request], "Response | Awaitable[Response | StreamResponse] | Pending | None"]


def status_line(status: int) -> bytes:
    return b"HTTP/1.1 %d %b\r\n" % (status, _REASONS.get(status, b"Unknown"))
