"""Memory bounds under load from one connection: pipelined large bodies and a huge upstream answer
stay within the configured caps (RSS of this process, where the gateway runs, is measured)."""

from __future__ import annotations

import asyncio
import os
import socket

import httptools
import msgspec

from rllm.gateway import GatewayConfig, GatewayServer

MiB = 1 << 20


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _Count:
    def __init__(self) -> None:
        self.statuses: list[int] = []
        self.parser = httptools.HttpResponseParser(self)

    def on_message_complete(self) -> None:
        self.statuses.append(self.parser.get_status_code())


def _pipeline(port: int, payload: bytes, n: int) -> list[int]:
    """Blocking client (in a thread, so its unsent bytes stay in the kernel, not in RSS): send
    ``payload`` (n requests) at once, then read the n answers."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(payload)
        seen = _Count()
        while len(seen.statuses) < n:
            data = sock.recv(1 << 16)
            if not data:
                break
            seen.parser.feed_data(data)
        return seen.statuses


async def test_pipelined_large_bodies_stay_within_max_pipelined_bytes(mock, held, wait_until):
    cfg = GatewayConfig(
        upstreams=[mock.url], health_interval_s=0, max_body_bytes=MiB, max_pipelined_bytes=2 * MiB
    )
    n = 40
    filler = "x" * (MiB - 200)
    # the bulk in a field nobody tokenizes, so the test spends its time on HTTP, not on the mock
    body = msgspec.json.encode({"model": "m", "messages": [{"role": "user", "content": "x"}], "user": filler})
    one = (
        f"POST /sessions/pipe/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    payload = one * n  # 40 MiB offered on one connection
    async with GatewayServer(cfg) as gw:
        before = rss_bytes()
        client = asyncio.create_task(asyncio.to_thread(_pipeline, gw.port, payload, n))
        await held.arrived.wait()  # the first call is held upstream; the rest queue behind it
        (conn,) = gw.http_server.connections
        await wait_until(lambda: conn._reading_paused, what="the gateway to stop reading")
        grown = rss_bytes() - before
        assert conn._queued_bytes <= cfg.max_pipelined_bytes + cfg.max_body_bytes
        assert grown < cfg.max_pipelined_bytes + cfg.max_body_bytes + 16 * MiB, grown / MiB
        held.release.set()
        assert await client == [200] * n  # back-pressure, not an error: every call is answered
        assert len(await gw.local_client().get_traces("pipe")) == n


async def test_a_huge_upstream_answer_stays_within_max_upstream_body_bytes(mock):
    """An upstream offering 200 MB: the gateway hangs up past the cap (502), holding at most
    about the cap in memory."""
    sent = 0

    async def huge(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal sent
        head = await reader.readuntil(b"\r\n\r\n")
        if head.startswith(b"GET"):  # the gateway's health check
            writer.write(b'HTTP/1.1 200 OK\r\nContent-Length: 11\r\nConnection: close\r\n\r\n{"data":[]}')
            writer.close()
            return
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        block = b"%x\r\n%b\r\n" % (65536, b"x" * 65536)
        try:
            for _ in range(3200):
                if writer.transport.is_closing():
                    break  # the gateway hung up
                writer.write(block)
                sent += 65536
                await writer.drain()
        except ConnectionError:
            pass
        writer.close()

    server = await asyncio.start_server(huge, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
    cap = 4 * MiB
    cfg = GatewayConfig(upstreams=[url], health_interval_s=0, proxy_lane=False, max_upstream_body_bytes=cap)
    try:
        async with GatewayServer(cfg) as gw:
            before = rss_bytes()
            reader, writer = await asyncio.open_connection(gw.host, gw.port)
            body = b'{"model": "m", "messages": [{"role": "user", "content": "x"}]}'
            writer.write(
                b"POST /sessions/h/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%b"
                % (len(body), body)
            )
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 60)
            grown = rss_bytes() - before
            writer.close()
            assert head.startswith(b"HTTP/1.1 502"), head
            assert sent < 200 * MiB
            assert grown < cap + 16 * MiB, grown / MiB
            (t,) = await gw.local_client().get_traces("h")
            assert t.status == "error" and "exceeds the limit" in t.metadata["error"]
    finally:
        server.close()
