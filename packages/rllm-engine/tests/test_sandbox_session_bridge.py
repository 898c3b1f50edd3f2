"""The host end of the sandbox's gateway bridge under hostile input: a real unix socket in front
of the real gateway; each refusal checked with a control that the same connection shape works."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rllm.engine.sandbox.session_bridge import BridgeLimits, BridgeRefused, SessionBridge
from rllm.gateway import GatewayClient
from rllm.testing import wait_until

BODY = b'{"model": "m", "messages": [{"role": "user", "content": "What is 2+2? #7"}]}'


@pytest.fixture
async def bridged(gateway) -> AsyncIterator[tuple[SessionBridge, Path, str]]:
    client = GatewayClient(gateway.url)
    session = await client.create_session()
    folder = Path(tempfile.mkdtemp(prefix="bridge-"))  # short: a unix socket path is <= 107 bytes
    bridge = SessionBridge(
        session.base_url,
        session.token or "",
        BridgeLimits(head_timeout_s=1, body_timeout_s=1, max_body_bytes=4096, max_connections=2),
    )
    await bridge.start(folder / "s.sock", None)
    try:
        yield bridge, folder / "s.sock", session.session_id
    finally:
        await bridge.close()
        shutil.rmtree(folder)


async def ask(sock: Path, raw: bytes) -> bytes:
    reader, writer = await asyncio.open_unix_connection(str(sock))
    writer.write(raw)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 30)
    writer.close()
    return answer


def post(path: str = "/v1/chat/completions", body: bytes = BODY, extra: str = "") -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    return head.encode() + body


def status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


async def test_a_plain_post_reaches_the_session_with_the_bridges_token(bridged, gateway):
    _, sock, session_id = bridged
    answer = await ask(sock, post())  # no Authorization at all: the bridge adds the session's
    assert status(answer) == 200 and b"The answer is 4. [7]" in answer
    assert len(await GatewayClient(gateway.url).get_traces(session_id)) == 1


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (post("/admin/sessions"), 403),
        (post("/sessions/other/v1/chat/completions"), 403),
        (post("/v1/../../other/v1/chat/completions"), 400),
        (post("/v1/%2e%2e/chat/completions"), 403),
        (post(extra="Transfer-Encoding: chunked\r\n"), 411),
        (post(extra="Content-Length: 5\r\n"), 400),  # a second Content-Length
        (post(body=b"x" * 5000), 413),
        (b"DELETE /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n", 405),
        (b"POST /v1/chat/completions\r\n\r\n", 400),
        (b"GET /v1/models HTTP/1.1\r\nBad Header\r\n\r\n", 400),
        (b"GET /v1/models HTTP/1.1\r\n" + b"X-Big: " + b"a" * 40_000 + b"\r\n\r\n", 431),
    ],
)
async def test_hostile_requests_are_refused_with_their_status(bridged, raw, code):
    bridge, sock, _ = bridged
    assert status(await ask(sock, raw)) == code
    assert bridge.stats["refused"] == 1
    assert status(await ask(sock, post())) == 200  # control: the bridge still serves


async def test_a_client_that_never_finishes_its_head_is_cut_off(bridged):
    _, sock, _ = bridged
    assert status(await ask(sock, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")) == 408


async def test_a_body_cut_short_is_refused_and_never_reaches_the_model(bridged, gateway):
    _, sock, session_id = bridged
    # Streamed through as it comes: the gateway got the head and 10 bytes, then nothing more.
    assert status(await ask(sock, post()[:-10])) == 408
    assert await GatewayClient(gateway.url).get_traces(session_id) == []
    assert status(await ask(sock, post())) == 200  # control


async def test_connections_over_the_cap_are_refused_not_queued(bridged):
    bridge, sock, _ = bridged
    idle = [await asyncio.open_unix_connection(str(sock)) for _ in range(2)]  # hold both slots
    try:
        await wait_until(lambda: bridge.open_connections == 2, what="the bridge to take both connections")
        assert status(await ask(sock, post())) == 503
    finally:
        for _, writer in idle:
            writer.close()


@given(st.text(alphabet=st.sampled_from("/.v1%?=&a-_~:\\#@ roles"), max_size=40))
def test_every_mapped_path_stays_under_the_session(target: str) -> None:
    bridge = SessionBridge("http://127.0.0.1:9/sessions/abc/v1", "tok")
    try:
        path = bridge.upstream_path(target)
    except BridgeRefused:
        return
    assert path.startswith(("/sessions/abc/v1", "/sessions/abc/roles/"))
    segments = path.split("?", 1)[0].split("/")
    assert ".." not in segments and "." not in segments and "" not in segments[1:-1]
    assert "%" not in path and "\\" not in path and "#" not in path
