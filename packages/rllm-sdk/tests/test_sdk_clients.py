"""Flows' OpenAI clients: one pool per event loop, one SSL context, session/role base URLs, no retries."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("openai")

from rllm.sdk import clients
from rllm.sdk.clients import async_openai, sync_openai
from rllm.types import AgentConfig


def _ssl_context(client):  # httpx's transport -> httpcore's pool keeps the context it was given
    transport = client._client._transport
    return getattr(transport, "network", transport)._pool._ssl_context  # (under the in-process router)


async def test_clients_share_one_ssl_context_and_target_the_session():
    config = AgentConfig(base_url="http://127.0.0.1:9/sessions/s1/v1", api_key="tok")
    plain, judge = async_openai(config), async_openai(config, role="judge")
    tls = async_openai(AgentConfig(base_url="https://example.invalid/v1"))
    try:
        # httpx would build a fresh context per client (even with verify=False), most of its cost
        assert _ssl_context(plain) is _ssl_context(judge) is _ssl_context(tls)
        assert str(plain.base_url) == "http://127.0.0.1:9/sessions/s1/v1/"
        assert str(judge.base_url) == "http://127.0.0.1:9/sessions/s1/roles/judge/v1/"
        assert plain.api_key == "tok" and plain.max_retries == 0
    finally:
        for c in (plain, judge, tls):
            await c.close()


def test_sync_client_shares_it_too():
    config = AgentConfig(base_url="http://127.0.0.1:9/v1")
    with sync_openai(config) as a, sync_openai(config) as b:
        assert _ssl_context(a) is _ssl_context(b)


_REPLY = (
    b'{"id":"c","object":"chat.completion","created":0,"model":"m","choices":[{"index":0,'
    b'"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}'
)


class _Server:
    """A loopback HTTP/1.1 keep-alive server that answers every POST with one chat completion and
    records, per request, its TCP connection, path and headers. It sets a cookie on each answer."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.connections = 0

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        conn = self.connections
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                line, *fields = head.decode().split("\r\n")
                headers = {k.lower(): v.strip() for k, _, v in (f.partition(":") for f in fields if f)}
                await reader.readexactly(int(headers.get("content-length", 0)))
                self.requests.append({"conn": conn, "path": line.split()[1], **headers})
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nset-cookie: sid=%d; Path=/\r\n"
                    b"content-length: %d\r\n\r\n%s" % (conn, len(_REPLY), _REPLY)
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def _ask(client) -> None:
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])


async def test_rollouts_on_one_loop_share_one_keep_alive_pool_and_keep_their_own_session():
    server = _Server()
    root = await server.start()
    try:
        for sid in ("s1", "s2", "s3"):  # three rollouts, one after the other, each closing its client
            async with async_openai(
                AgentConfig(base_url=f"{root}/sessions/{sid}/v1", api_key=f"tok-{sid}")
            ) as c:
                await _ask(c)
        judge = async_openai(AgentConfig(base_url=f"{root}/sessions/s4/v1", api_key="tok-s4"), role="judge")
        await _ask(judge)
        assert judge._client is async_openai(AgentConfig(base_url=root))._client  # the loop's pool
    finally:
        await server.stop()
    # One TCP connection served every rollout (closing a rollout's client left the pool open) ...
    assert server.connections == 1 and len(server.requests) == 4
    # ... and each request still went to its own session URL with its own token, and no cookie
    # one answer set travelled with a later session's request.
    assert [(r["path"], r["authorization"]) for r in server.requests] == [
        ("/sessions/s1/v1/chat/completions", "Bearer tok-s1"),
        ("/sessions/s2/v1/chat/completions", "Bearer tok-s2"),
        ("/sessions/s3/v1/chat/completions", "Bearer tok-s3"),
        ("/sessions/s4/roles/judge/v1/chat/completions", "Bearer tok-s4"),
    ]
    assert not any("cookie" in r for r in server.requests)


def test_a_closed_loops_pool_is_not_reused():
    config = AgentConfig(base_url="http://127.0.0.1:9/v1")

    async def pool():
        return asyncio.get_running_loop(), async_openai(config)._client

    first_loop, first = asyncio.run(pool())
    _, second = asyncio.run(pool())  # a new loop: the first one is closed
    assert first is not second
    assert first_loop not in clients._POOLS  # its entry (which holds the loop alive) is gone


async def test_clients_skip_openais_per_client_platform_lookup():
    # openai looks the platform up on a worker thread at each client's first request while it is unset.
    client = async_openai(AgentConfig(base_url="http://127.0.0.1:9/v1"))
    assert (
        client._platform is not None and client._platform is async_openai(AgentConfig(base_url="x"))._platform
    )
