"""The lean HTTP/1.1 server (rllm.runtime) under the gateway, spoken to over raw loopback sockets and aiohttp."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator

import aiohttp
import pytest

from rllm.runtime.http_messages import Request, Response, StreamResponse
from rllm.runtime.http_router import Router
from rllm.runtime.http_server import HttpServer
from rllm.testing import wait_until


def error_response(status: int, message: str) -> Response:
    """OpenAI-shaped errors, as the gateway's own error factory gives them."""
    kind = {404: "not_found_error", 405: "invalid_request_error"}.get(status, "invalid_request_error")
    if status >= 500:
        kind = "server_error"
    body = json.dumps({"error": {"message": message, "type": kind, "code": str(status)}}).encode()
    return Response(status=status, body=body)


BIG = bytes(range(256)) * (5 * 4096)  # a 5 MiB plain answer (written in 1 MiB slices)


class _App:
    """A small app over the server: echo, slow, stream and failing routes."""

    def __init__(self) -> None:
        self.router = Router()
        self.cancelled = asyncio.Event()
        self.started = asyncio.Event()
        r = self.router
        r.add("POST", "/echo", self.echo)
        r.add("GET", "/items/{item}/parts/{part}", self.params)
        r.add("GET", "/items/special/parts/x", self.static)
        r.add("GET", "/slow", self.slow)
        r.add("GET", "/stream", self.stream)
        r.add("GET", "/big-stream", self.big_stream)
        r.add("GET", "/stream-then-fail", self.stream_then_fail)
        r.add("GET", "/abort", self.abort)
        r.add("GET", "/stream-then-abort", self.stream_then_abort)
        r.add("GET", "/big", self.big)
        r.add("GET", "/huge", self.huge)

    async def dispatch(self, request: Request) -> Response | StreamResponse:
        return await self.router.dispatch(request, error_response)

    async def echo(self, request: Request) -> Response:
        body = await request.read()
        info = {
            "len": len(body),
            "head": body[:20].decode(),
            "ctype": request.headers.get("CONTENT-TYPE"),
            "query": request.query,
        }
        return Response(body=json.dumps(info).encode())

    async def params(self, request: Request) -> Response:
        return Response(body=json.dumps(request.match_info).encode())

    async def big(self, request: Request) -> Response:
        self.started.set()
        return Response(body=BIG, content_type="application/octet-stream")

    async def huge(self, request: Request) -> Response:
        self.started.set()
        return Response(body=BIG * 8, content_type="application/octet-stream")

    async def static(self, request: Request) -> Response:
        return Response(body=b'{"static": true}')

    async def slow(self, request: Request) -> Response:
        self.started.set()
        try:
            await asyncio.sleep(float(request.query.get("s", "30")))
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return Response(body=b'{"slow": "done"}')

    async def stream(self, request: Request) -> StreamResponse:
        out = StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        for i in range(3):
            await out.write(f"data: {i}\n\n".encode())
        return out

    async def big_stream(self, request: Request) -> StreamResponse:
        out = StreamResponse(headers={"Content-Type": "application/octet-stream"})
        await out.prepare(request)
        self.started.set()
        try:
            for _ in range(400):
                await out.write(b"x" * 256 * 1024)
        except (asyncio.CancelledError, ConnectionResetError):
            self.cancelled.set()
            raise
        return out

    async def stream_then_fail(self, request: Request) -> Response | StreamResponse:
        out = StreamResponse()
        await out.prepare(request)
        await out.write(b"partial")
        return error_response(500, "broke after the stream began")

    async def abort(self, request: Request) -> Response:
        request.abort()
        return Response(body=b'{"never": "sent"}')

    async def stream_then_abort(self, request: Request) -> StreamResponse:
        out = StreamResponse()
        await out.prepare(request)
        await out.write(b"partial")
        request.abort()
        return out


@pytest.fixture
async def served() -> AsyncIterator[tuple[_App, HttpServer, int]]:
    app = _App()
    server = HttpServer(app.dispatch, error_response, max_body_bytes=4096, keepalive_timeout_s=0.5)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    port = sock.getsockname()[1]
    await server.start(sock)
    yield app, server, port
    await server.stop(1.0)


async def _exchange(port: int, raw: bytes, until_close: bool = False, min_responses: int = 1) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    data = b""
    try:
        while True:
            chunk = await asyncio.wait_for(reader.read(65536), 5)
            if not chunk:
                break
            data += chunk
            if not until_close and data.count(b"HTTP/1.1 ") >= min_responses and data.endswith(b"}"):
                break
    finally:
        writer.close()
    return data


def _post(path: str, body: bytes, extra: str = "") -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    return f"{head}Content-Length: {len(body)}\r\n{extra}\r\n".encode() + body


async def test_keep_alive_and_pipelined_requests_are_answered_in_order(served):
    _, _, port = served
    raw = _post("/echo?a=1&a=2&b=", b'{"n": 1}') + _post("/echo", b'{"n": 22}')
    data = await _exchange(port, raw, min_responses=2)
    first, second = data.split(b"HTTP/1.1 ")[1:]
    assert first.startswith(b"200 OK") and second.startswith(b"200 OK")
    assert b'"len": 8' in first and b'"query": {"a": "1", "b": ""}' in first
    assert b'"len": 9' in second
    assert b"Connection: close" not in data and b"Date: " in data


async def test_chunked_request_body_and_header_case(served):
    _, _, port = served
    raw = (
        b"POST /echo HTTP/1.1\r\nHost: x\r\ncontent-type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    )
    data = await _exchange(port, raw)
    assert b'"len": 11' in data and b'"head": "hello world"' in data and b'"ctype": "text/plain"' in data


async def test_expect_continue_gets_100_then_the_answer(served):
    _, _, port = served
    data = await _exchange(port, _post("/echo", b"{}", "Expect: 100-continue\r\n"), min_responses=2)
    assert data.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK")


async def test_malformed_http_gets_a_json_400_and_the_connection_closes(served):
    _, _, port = served
    data = await _exchange(port, b"GARBAGE\x00\x01 nonsense\r\n\r\n", until_close=True)
    assert data.startswith(b"HTTP/1.1 400 Bad Request") and b"Connection: close" in data
    assert json.loads(data.split(b"\r\n\r\n", 1)[1])["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("chunked", [False, True])
async def test_body_over_the_limit_is_413_and_the_connection_stays_usable(served, chunked):
    _, _, port = served
    big = b"x" * 5000
    if chunked:
        first = b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        first += b"%x\r\n%b\r\n0\r\n\r\n" % (len(big), big)
    else:
        first = _post("/echo", big)
    data = await _exchange(port, first + _post("/echo", b"{}"), min_responses=2)
    first_answer, second_answer = data.split(b"HTTP/1.1 ")[1:]
    assert first_answer.startswith(b"413 ") and b"4096 bytes" in first_answer
    assert second_answer.startswith(b"200 OK")


async def test_http10_without_keep_alive_is_closed_after_the_answer(served):
    _, _, port = served
    raw = b"POST /echo HTTP/1.0\r\nContent-Length: 2\r\n\r\n{}"
    data = await _exchange(port, raw, until_close=True)
    assert data.startswith(b"HTTP/1.1 200 OK") and b"Connection: close" in data


async def test_routes_params_404_and_405(served):
    _, _, port = served
    async with aiohttp.ClientSession() as s:
        async with s.get(f"http://127.0.0.1:{port}/items/a%20b/parts/7") as r:
            assert await r.json() == {"item": "a b", "part": "7"}
        async with s.get(f"http://127.0.0.1:{port}/items/special/parts/x") as r:
            assert await r.json() == {"static": True}
        async with s.get(f"http://127.0.0.1:{port}/nowhere") as r:
            assert r.status == 404 and (await r.json())["error"]["type"] == "not_found_error"
        async with s.delete(f"http://127.0.0.1:{port}/echo") as r:
            assert r.status == 405


async def test_streamed_response_arrives_chunked(served):
    _, _, port = served
    async with aiohttp.ClientSession() as s:
        async with s.get(f"http://127.0.0.1:{port}/stream") as r:
            assert r.headers["Content-Type"] == "text/event-stream"
            assert r.headers["Transfer-Encoding"] == "chunked"
            assert await r.read() == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
        # the same kept-alive connection still works after a stream
        async with s.post(f"http://127.0.0.1:{port}/echo", data=b"{}") as r:
            assert r.status == 200


async def test_client_disconnect_cancels_the_handler(served):
    app, _, port = served
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
    await asyncio.wait_for(app.started.wait(), 5)
    writer.close()
    await asyncio.wait_for(app.cancelled.wait(), 5)


async def test_a_client_that_stops_reading_holds_the_stream_back(served):
    """100 MB offered to a client that reads nothing: write back-pressure stops the handler, and
    closing the client ends it."""
    app, server, port = served
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /big-stream HTTP/1.1\r\nHost: x\r\n\r\n")
    await asyncio.wait_for(app.started.wait(), 5)
    (conn,) = server.connections
    # until the transport's buffer is full and the handler waits on it (for the client, not
    # buffering 100 MB)
    await wait_until(lambda: conn.paused is not None, what="the handler to wait on the client")
    assert conn.transport.get_write_buffer_size() < 20 * 1024 * 1024
    writer.close()
    await asyncio.wait_for(app.cancelled.wait(), 5)


async def test_failure_after_the_stream_began_truncates_the_connection(served):
    _, _, port = served
    data = await _exchange(port, b"GET /stream-then-fail HTTP/1.1\r\nHost: x\r\n\r\n", until_close=True)
    assert b"Transfer-Encoding: chunked" in data and b"partial" in data
    assert not data.endswith(b"0\r\n\r\n")  # no clean end: the client knows the stream broke


async def test_idle_kept_alive_connections_are_reaped(served):
    _, server, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_post("/echo", b"{}"))
    await reader.readuntil(b'"query": {}}')
    assert len(server.connections) == 1
    assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the server after ~0.5 s idle
    writer.close()
    assert not server.connections


async def test_stop_lets_an_in_flight_request_finish(served):
    app, server, port = served
    async with aiohttp.ClientSession() as s:
        pending = asyncio.ensure_future(s.get(f"http://127.0.0.1:{port}/slow?s=0.3"))
        await asyncio.wait_for(app.started.wait(), 5)
        await server.stop(5.0)
        resp = await pending
        assert resp.status == 200 and await resp.json() == {"slow": "done"}
    assert not server.connections


async def test_oversized_request_head_gets_431_and_the_connection_closes(served):
    _, _, port = served
    raw = b"GET /echo HTTP/1.1\r\nHost: x\r\n" + b"X-Filler: " + b"a" * 70_000 + b"\r\n\r\n"
    data = await _exchange(port, raw, until_close=True)
    assert data.startswith(b"HTTP/1.1 431 ") and b"Connection: close" in data


async def test_head_is_get_without_the_body(served):
    _, _, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"HEAD /items/a/parts/b HTTP/1.1\r\nHost: x\r\n\r\nGET /items/c/parts/d HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and b"Content-Length: 26" in head
    # no body follows the HEAD answer: the next bytes are the GET's status line
    second = await reader.readuntil(b"\r\n\r\n")
    assert second.startswith(b"HTTP/1.1 200 OK")
    assert await reader.readexactly(26) == b'{"item": "c", "part": "d"}'
    writer.close()


async def test_abort_drops_the_connection_without_an_answer(served):
    _, server, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /abort HTTP/1.1\r\nHost: x\r\n\r\n")
    try:
        data = await asyncio.wait_for(reader.read(), 5)
    except ConnectionResetError:
        data = b""
    writer.close()
    assert data == b""  # neither the handler's response nor anything else
    await wait_until(lambda: not server.connections, what="the server to drop the connection")
    # the server itself carries on
    async with aiohttp.ClientSession() as s, s.post(f"http://127.0.0.1:{port}/echo", data=b"{}") as r:
        assert r.status == 200


async def test_abort_mid_stream_leaves_the_stream_unterminated(served):
    _, _, port = served
    data = await _exchange(port, b"GET /stream-then-abort HTTP/1.1\r\nHost: x\r\n\r\n", until_close=True)
    assert b"Transfer-Encoding: chunked" in data and b"partial" in data
    assert not data.endswith(b"0\r\n\r\n")
    async with aiohttp.ClientSession() as s:
        with pytest.raises(aiohttp.ClientPayloadError):
            async with s.get(f"http://127.0.0.1:{port}/stream-then-abort") as r:
                await r.read()


async def _read_answer(reader: asyncio.StreamReader, with_body: bool = True) -> tuple[bytes, bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    body = await asyncio.wait_for(reader.readexactly(length), 30) if with_body else b""
    return head, body


async def test_large_answers_go_out_whole_and_in_order_between_pipelined_requests(served):
    _, _, port = served
    get_big = b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n"
    raw = get_big + _post("/echo", b'{"n": 1}') + b"HEAD /big HTTP/1.1\r\nHost: x\r\n\r\n" + get_big
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    try:
        first = await _read_answer(reader)
        echo = await _read_answer(reader)
        head_only = await _read_answer(reader, with_body=False)
        last = await _read_answer(reader)
    finally:
        writer.close()
    assert first[1] == BIG and last[1] == BIG
    assert echo[0].startswith(b"HTTP/1.1 200") and json.loads(echo[1])["len"] == 8
    assert head_only[0].startswith(b"HTTP/1.1 200") and b"Content-Length: %d" % len(BIG) in head_only[0]


async def test_a_client_that_stops_reading_a_large_answer_holds_it_back(served):
    """A 40 MiB plain answer to a client that reads nothing: it waits in slices as the client
    reads, so the transport holds about one slice, not all the kernel did not take (or two
    copies of that)."""
    app, server, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /huge HTTP/1.1\r\nHost: x\r\n\r\n" + _post("/echo", b"{}"))
    await asyncio.wait_for(app.started.wait(), 5)
    (conn,) = server.connections
    await wait_until(lambda: conn.paused is not None, what="the server to wait for the client")
    assert conn.transport.get_write_buffer_size() <= 2 * 1024 * 1024
    _, body = await _read_answer(reader)  # reading lets the rest, then the next answer, go
    assert body == BIG * 8
    assert json.loads((await _read_answer(reader))[1])["len"] == 2
    writer.close()
