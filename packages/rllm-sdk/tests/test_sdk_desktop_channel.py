"""The host's end of the desktop helper (rllm.sdk.desktop_channel) against a helper that lies:
real pipes, the test writing what a hostile process in the sandbox could. Nothing it sends may
make the host read more than the request can need, wait past its deadline, or take a reply to
another request; a broken channel drops to None (one exec per action) after one loud error."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rllm.sdk import desktop_channel
from rllm.sdk.desktop_channel import MAX_SMALL_REPLY, HelperChannel
from rllm.sdk.desktop_helper import HEADER, MAGIC, SHOT_HEADER
from rllm.sdk.sandbox import DesktopSpec, SandboxError

SPEC = DesktopSpec(width=64, height=64)


def frame(
    number: int, payload: bytes, status: int = 0, magic: bytes = MAGIC, length: int | None = None
) -> bytes:
    return HEADER.pack(magic, number, status, len(payload) if length is None else length) + payload


class Pipes:
    """A channel over a real socket pair; ``send`` is what the helper writes, ``requests`` what
    it was asked."""

    def __init__(self, channel: HelperChannel, helper: socket.socket) -> None:
        self.channel, self.helper = channel, helper

    @classmethod
    async def open(cls) -> Pipes:
        host, helper = socket.socketpair()
        channel = HelperChannel(SPEC)
        channel.connected(*await asyncio.open_unix_connection(sock=host))
        return cls(channel, helper)

    def send(self, data: bytes) -> None:
        self.helper.sendall(data)

    def end(self) -> None:
        self.helper.shutdown(socket.SHUT_WR)

    def requests(self) -> list[dict]:
        self.helper.setblocking(False)
        try:
            data = self.helper.recv(1 << 20)
        except BlockingIOError:
            return []
        return [json.loads(line) for line in data.splitlines()]

    async def request_sent(self) -> None:
        """Return once a request is waiting for the helper (an event, not a poll)."""
        loop = asyncio.get_running_loop()
        ready = loop.create_future()
        loop.add_reader(self.helper.fileno(), lambda: ready.done() or ready.set_result(None))
        try:
            await ready
        finally:
            loop.remove_reader(self.helper.fileno())

    def close(self) -> None:
        self.channel.close()
        self.helper.close()


async def test_a_well_behaved_helper_round_trip() -> None:
    pipes = await Pipes.open()
    try:
        pipes.send(frame(0, b"ok") + frame(1, b"10 20"))
        assert await pipes.channel.call("cursor") == b"10 20"
        assert pipes.requests() == [{"id": 1, "op": "cursor"}]
        pipes.send(frame(2, b"no such window", status=1))
        with pytest.raises(SandboxError, match="desktop click failed: no such window"):
            await pipes.channel.call("click", x=1, y=2, button=1)
        assert pipes.channel.state == "ready"  # a failed action is not a broken channel
    finally:
        pipes.close()


async def test_a_helper_that_never_said_hello_is_unused_and_nothing_was_sent() -> None:
    pipes = await Pipes.open()
    try:
        pipes.send(frame(0, b"the desktop helper cannot start: no libxdo", status=1))
        assert await pipes.channel.call("click", x=1, y=1, button=1) is None
        assert pipes.channel.state == "unavailable" and "no libxdo" in pipes.channel.why
        assert pipes.requests() == []
    finally:
        pipes.close()


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (frame(1, b"", length=MAX_SMALL_REPLY + 1), "announced a 65537-byte reply"),
        (frame(7, b"10 20"), "replied to request 7, not 1"),
        (frame(1, b"10 20", magic=b"XXXX"), "malformed reply header"),
        (frame(1, b"10 20", status=9), "malformed reply header"),
        (frame(1, b"10 20")[:-2], "ended"),  # then its pipe closes
    ],
)
async def test_a_lying_helper_breaks_the_channel_once_then_calls_get_none(reply: bytes, message: str) -> None:
    pipes = await Pipes.open()
    try:
        pipes.send(frame(0, b"ok") + reply)
        if message == "ended":
            pipes.end()
        with pytest.raises(SandboxError, match=message):
            await pipes.channel.call("cursor")
        assert pipes.channel.state == "broken"
        assert await pipes.channel.call("cursor") is None  # the caller execs from now on
        assert len(pipes.requests()) == 1
    finally:
        pipes.close()


async def test_a_screenshot_may_be_as_large_as_the_screen_and_no_larger() -> None:
    pipes = await Pipes.open()
    try:
        biggest = SHOT_HEADER.size + (SPEC.width * 4 + 64) * SPEC.height
        pipes.send(frame(0, b"ok") + frame(1, bytes(biggest)))
        assert len(await pipes.channel.call("shot") or b"") == biggest
        pipes.send(frame(2, b"", length=biggest + 1))
        with pytest.raises(SandboxError, match="announced"):
            await pipes.channel.call("shot")
    finally:
        pipes.close()


async def test_a_silent_helper_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(desktop_channel, "CALL_TIMEOUT_S", 0.2)
    pipes = await Pipes.open()
    try:
        pipes.send(frame(0, b"ok") + HEADER.pack(MAGIC, 1, 0, 10) + b"abc")  # 7 bytes never come
        with pytest.raises(SandboxError, match=r"did not reply within 0\.2 s"):
            await pipes.channel.call("cursor")
        assert pipes.channel.state == "broken"
    finally:
        pipes.close()


async def test_a_cancelled_call_breaks_the_channel() -> None:
    pipes = await Pipes.open()
    try:
        pipes.send(frame(0, b"ok"))
        call = asyncio.ensure_future(pipes.channel.call("cursor"))
        await pipes.request_sent()  # its reply never comes
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert pipes.channel.state == "broken"  # a late reply must not answer the next request
    finally:
        pipes.close()


async def test_a_helper_known_to_be_gone_gets_none_and_nothing_is_sent() -> None:
    pipes = await Pipes.open()
    try:
        pipes.send(frame(0, b"ok") + frame(1, b"1 2"))
        assert await pipes.channel.call("cursor") == b"1 2"
        reader, _ = pipes.channel._connection.result()
        assert pipes.requests() == [{"id": 1, "op": "cursor"}]
        pipes.helper.close()  # the helper died while idle
        await reader.read()  # the host has seen its end
        assert await pipes.channel.call("click", x=1, y=1, button=1) is None
        assert pipes.channel.state == "broken" and "connection ended" in pipes.channel.why
    finally:
        pipes.close()


async def test_later_connections_are_refused_and_a_closed_channel_stops_listening() -> None:
    pipes = await Pipes.open()
    stopped: list[bool] = []
    try:
        pipes.channel.on_close(lambda: stopped.append(True))
        intruder, other = socket.socketpair()
        reader, writer = await asyncio.open_unix_connection(sock=other)
        pipes.channel.connected(reader, writer)  # a second "helper": closed at once
        intruder.setblocking(False)
        assert await asyncio.get_running_loop().sock_recv(intruder, 1) == b""
        intruder.close()
        pipes.send(frame(0, b"ok") + frame(1, b"3 4"))
        assert await pipes.channel.call("cursor") == b"3 4"  # the first one is still the helper
    finally:
        pipes.close()
    assert stopped == [True]


async def test_a_call_waiting_for_a_helper_that_never_connects_ends_at_close() -> None:
    channel = HelperChannel(SPEC)
    call = asyncio.ensure_future(channel.call("cursor"))
    await asyncio.sleep(0)  # the call is waiting for the connection
    channel.close()
    assert await call is None
    assert channel.state == "unavailable" and "closed" in channel.why


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=300), st.booleans())
def test_any_bytes_from_the_helper_give_a_bounded_reply_none_or_a_sandbox_error(
    data: bytes, hello: bool
) -> None:
    async def run() -> None:
        desktop_channel.CALL_TIMEOUT_S = 0.05  # restored below; the helper's bytes are all written
        pipes = await Pipes.open()
        try:
            pipes.send((frame(0, b"ok") if hello else b"") + data)
            pipes.end()
            try:
                reply = await pipes.channel.call("cursor")
            except SandboxError:
                assert pipes.channel.state == "broken"
            else:
                assert reply is None or len(reply) <= MAX_SMALL_REPLY
        finally:
            pipes.close()

    saved = desktop_channel.CALL_TIMEOUT_S
    try:
        asyncio.run(run())
    finally:
        desktop_channel.CALL_TIMEOUT_S = saved
