"""The lean upstream client against a real aiohttp server: framing, keep-alive, failures."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from rllm.gateway.fasthttp import FastHttpPool, UpstreamConnectError


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
