"""The lean upstream client against a real aiohttp server: framing, keep-alive, failures."""

from __future__ import annotations

import asyncio
import re

import pytest
from aiohttp import web

from rllm.runtime.http_client import (
    FastHttpPool,
    UpstreamBadResponse,
    UpstreamConnectError,
    UpstreamDropped,
    UpstreamTooLarge,
    UpstreamTooSlow,
    parse_response,
)


@pytest.fixture
async def server():
    peers: set = set()

    async def fixed(request: web.Request) -> web.Response:
        peers.add(request.transport.get_extra_info("peername"))
        return web.Response(body=b"L" + await request.read())

    async def chunked(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for part in (b"ab", b"", b"cdef" * 1000):
            if part:
                await resp.write(part)
        await resp.write_eof()
        return resp

    async def close(request: web.Request) -> web.Response:
        return web.Response(body=b"bye", headers={"Connection": "close"}, status=418)

    app = web.Application()
    app.router.add_post("/fixed", fixed)
    app.router.add_post("/chunked", chunked)
    app.router.add_post("/close", close)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}", peers
    await runner.cleanup()


async def test_content_length_chunked_and_close(server):
    url, peers = server
    pool = FastHttpPool(connect_timeout_s=2, read_timeout_s=5)
    for i in range(5):
        assert await pool.post(f"{url}/fixed", f"x{i}".encode()) == (200, f"Lx{i}".encode())
    assert len(peers) == 1  # one keep-alive connection served them all
    assert await pool.post(f"{url}/chunked", b"") == (200, b"ab" + b"cdef" * 1000)
    assert await pool.post(f"{url}/close", b"") == (418, b"bye")
    many = await asyncio.gather(*(pool.post(f"{url}/fixed", str(i).encode()) for i in range(50)))
    assert [b for _, b in many] == [f"L{i}".encode() for i in range(50)]
    pool.close()


async def test_connect_failure_is_reported():
    pool = FastHttpPool(connect_timeout_s=1, read_timeout_s=1)
    with pytest.raises(UpstreamConnectError):
        await pool.post("http://127.0.0.1:9/v1/x", b"{}")


async def test_send_nowait_answers_from_the_connection_callback(server):
    url, peers = server
    pool = FastHttpPool(connect_timeout_s=2, read_timeout_s=5)
    assert pool.send_nowait(f"{url}/fixed", b"cold", lambda outcome: None) is None  # nothing idle yet
    assert await pool.post(f"{url}/fixed", b"warm") == (200, b"Lwarm")
    answered: asyncio.Future = asyncio.get_running_loop().create_future()
    assert pool.send_nowait(f"{url}/fixed", b"now", answered.set_result) is not None
    assert await answered == (200, b"Lnow")
    assert len(peers) == 1  # the connection went back to the pool and is reused
    chunked: asyncio.Future = asyncio.get_running_loop().create_future()
    pool.send_nowait(f"{url}/chunked", b"", chunked.set_result)
    assert await chunked == (200, b"ab" + b"cdef" * 1000)
    # Cancelled: the callback never runs and the connection (its answer still coming) is dropped.
    seen: list = []
    handle = pool.send_nowait(f"{url}/fixed", b"x", seen.append)
    handle.cancel()
    assert await pool.post(f"{url}/fixed", b"y") == (200, b"Ly")
    assert handle.transport.is_closing()  # dropped at once: nothing can reach its callback
    assert seen == [] and len(peers) == 2
    pool.close()


async def test_send_nowait_reports_a_dead_connection_and_a_timeout():
    hold: list[asyncio.StreamWriter] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(int(re.search(rb"Content-Length: (\d+)", head).group(1)))
        if b"/hang" in head:
            hold.append(writer)  # never answers
        elif b"/die" in head:
            writer.close()
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
            await serve(reader, writer)

    srv = await asyncio.start_server(serve, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"
    pool = FastHttpPool(connect_timeout_s=2, read_timeout_s=0.2)
    for path, error in (("/die", UpstreamDropped), ("/hang", TimeoutError)):
        assert await pool.post(f"{url}/ok", b"{}") == (200, b"ok")
        outcome: asyncio.Future = asyncio.get_running_loop().create_future()
        assert pool.send_nowait(url + path, b"{}", outcome.set_result) is not None
        assert isinstance(await outcome, error)
    pool.close()
    srv.close()


async def test_an_answer_has_answer_timeout_s_from_its_first_byte_and_max_body_bytes_in_all():
    """The wait for an answer to start is the caller's (here a slow one is answered whole); once
    it has started it must end within ``answer_timeout_s`` (a stall mid-body is UpstreamTooSlow)
    and stay within ``max_body_bytes`` (an endless body is UpstreamTooLarge)."""
    release = asyncio.Event()
    late = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(int(re.search(rb"Content-Length: (\d+)", head).group(1)))
        try:
            if b"/late" in head:  # nothing for a while (well past answer_timeout_s), then all of it
                await late.wait()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nlate")
            elif b"/stall" in head:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly the start")
                await writer.drain()
                await release.wait()
            else:  # endless chunks
                writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                while not release.is_set():
                    writer.write(b"1000\r\n" + b"x" * 4096 + b"\r\n")
                    await writer.drain()
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    srv = await asyncio.start_server(serve, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"
    pool = FastHttpPool(
        connect_timeout_s=5, read_timeout_s=600, max_idle=0, max_body_bytes=64 * 1024, answer_timeout_s=0.05
    )
    try:
        asyncio.get_running_loop().call_later(0.5, late.set)  # ten answer timeouts before the first byte
        assert await pool.post(url + "/late", b"{}") == (200, b"late")
        with pytest.raises(UpstreamTooSlow, match=r"within 0\.05 s of its first byte"):
            await pool.post(url + "/stall", b"{}")
        with pytest.raises(UpstreamTooLarge, match="exceeds the limit of 65536"):
            await pool.post(url + "/endless", b"{}")
    finally:
        release.set()
        pool.close()
        srv.close()
        await srv.wait_closed()


@pytest.mark.parametrize("split", [1, 7, 64])
def test_parse_response_waits_for_whole_messages(split):
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=1\r\nabc\r\n2\r\n\r\n\r\n0\r\n\r\n"
    fixed = b"HTTP/1.1 201 Created\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello"
    for wire, want in ((chunked, (200, b"abc\r\n", True)), (fixed, (201, b"hello", False))):
        buf = bytearray()
        for i in range(0, len(wire), split):
            assert parse_response(buf, closed=False) is None
            buf += wire[i : i + split]
        assert parse_response(buf, closed=False) == want
        assert buf == bytearray()  # the message was taken off the buffer
    to_eof = bytearray(b"HTTP/1.0 200 OK\r\n\r\nrest of it")
    assert parse_response(to_eof, closed=False) is None
    assert parse_response(to_eof, closed=True) == (200, b"rest of it", False)
    with pytest.raises(UpstreamDropped, match="mid-body"):
        parse_response(bytearray(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort"), closed=True)
    with pytest.raises(UpstreamDropped, match="status line"):
        parse_response(bytearray(b"garbage\r\n\r\n"), closed=False)


async def test_a_closing_idle_connection_is_never_reused(server):
    """Between the peer's close being read and connection_lost running, an idle connection's
    transport is closing: taking it would make the write raise instead of failing over."""
    url, _ = server
    pool = FastHttpPool(connect_timeout_s=2, read_timeout_s=5)
    assert await pool.post(f"{url}/fixed", b"a") == (200, b"La")
    (idle,) = [c for conns in pool._idle.values() for c in conns]
    idle.transport.close()  # closing now; connection_lost comes on a later loop pass
    assert not idle.closed
    assert pool.send_nowait(f"{url}/fixed", b"b", lambda outcome: None) is None
    assert await pool.post(f"{url}/fixed", b"c") == (200, b"Lc")
    pool.close()


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-2\r\n{}\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n",
    ],
    ids=[
        "length-not-a-number",
        "negative-length",
        "two-lengths",
        "bad-chunk-size",
        "negative-chunk",
        "too-big",
    ],
)
@pytest.mark.parametrize("closed", [False, True])
def test_bad_framing_is_a_bad_response_not_a_hang_or_a_short_body(raw, closed):
    with pytest.raises(UpstreamBadResponse):
        parse_response(bytearray(raw), closed, max_body=1000)
