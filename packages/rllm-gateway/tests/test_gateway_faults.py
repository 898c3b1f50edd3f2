"""Upstream faults: every call the gateway accepts ends with exactly one trace whose status says
what happened, and no fault of one session changes another's traces.

``FaultUpstream`` is a test-only upstream on a raw loopback socket that answers each call with a
scripted fault (wrong-shape JSON, bad framing, oversize answers, broken or stalled streams), which
the well-behaved MockUpstream cannot produce. Each class runs on the early lane and on the task
path, with the memory and the SQLite store.
"""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
import msgspec
import pytest

from rllm.gateway import GatewayConfig, GatewayServer

_CHAT = {
    "id": "c1",
    "object": "chat.completion",
    "model": "fault-model",
    "prompt_token_ids": [1, 2, 3],
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "fine"},
            "finish_reason": "stop",
            "token_ids": [7, 8],
            "logprobs": {"content": [{"token": "a", "logprob": -0.5}, {"token": "b", "logprob": -0.25}]},
        }
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
}


def _with_choice(**changes) -> bytes:
    body = msgspec.json.decode(msgspec.json.encode(_CHAT))
    body["choices"][0].update(changes)
    return msgspec.json.encode(body)


def _head(extra: str) -> bytes:
    return f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n{extra}\r\n".encode()


def _fixed(body: bytes) -> bytes:
    return _head(f"Content-Length: {len(body)}\r\n") + body


# Whole answers: name -> (raw bytes written, then the connection is closed)
WHOLE_FAULTS: dict[str, bytes] = {
    "json_list": _fixed(b"[1, 2, 3]"),
    "choices_not_a_list": _fixed(b'{"choices": {"0": {}}}'),
    "choice_not_an_object": _fixed(b'{"choices": ["text"]}'),
    "missing_logprob": _fixed(_with_choice(logprobs={"content": [{"token": "a"}, {"token": "b"}]})),
    "token_ids_a_string": _fixed(_with_choice(token_ids="7,8")),
    "token_id_beyond_int32": _fixed(_with_choice(token_ids=[7, 2**40])),
    "usage_beyond_int64": _fixed(msgspec.json.encode({**_CHAT, "usage": {"prompt_tokens": 2**70}})),
    "malformed_json": _fixed(b'{"choices": ['),
    "content_length_not_a_number": _head("Content-Length: abc\r\n") + b"{}",
    "negative_content_length": _head("Content-Length: -5\r\n") + msgspec.json.encode(_CHAT),
    "bad_chunk_size": _head("Transfer-Encoding: chunked\r\n") + b"zz\r\n{}\r\n0\r\n\r\n",
}


def _sse(*events: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    return head + b"".join(b"%x\r\n%b\r\n" % (len(e), e) for e in events)


_DELTA = b'data: {"choices":[{"index":0,"delta":{"content":"he"},"token_ids":[5],"logprobs":{"content":[{"logprob":-1.0}]}}]}\n\n'
STREAM_FAULTS: dict[str, tuple[bytes, bool]] = {  # name -> (bytes, then stall instead of closing)
    "event_not_json": (_sse(_DELTA, b"data: {broken\n\n", b"data: [DONE]\n\n") + b"0\r\n\r\n", False),
    "event_wrong_shape": (
        _sse(_DELTA, b'data: {"choices":[{"index":0,"token_ids":"x"}]}\n\n', b"data: [DONE]\n\n")
        + b"0\r\n\r\n",
        False,
    ),
    "stall_mid_stream": (_sse(_DELTA), True),
    "event_over_the_size_limit": (_sse(b"data: " + b"x" * 300_000), True),
}


class FaultUpstream:
    """A raw-socket upstream (test-only): answers ``GET /v1/models``, and each POST with ``fault``
    (a key of WHOLE_FAULTS / STREAM_FAULTS, ``"ok"`` for a valid answer on a kept-alive connection,
    or ``"huge"`` for an endless answer). ``arrived`` is set when a POST came in."""

    def __init__(self) -> None:
        self.fault = "ok"
        self.arrived = asyncio.Event()
        self.posts = 0
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.url = ""

    async def start(self) -> FaultUpstream:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/v1"
        return self

    async def stop(self) -> None:
        for w in list(self._writers):
            w.close()
        if self._server is not None:
            self._server.close()

    def _fault_for(self, body: bytes) -> str:
        """A call whose last message reads ``fault:<name>`` gets that fault; others ``fault``."""
        try:
            text = msgspec.json.decode(body)["messages"][-1]["content"]
        except (msgspec.DecodeError, KeyError, IndexError, TypeError):
            return self.fault
        return text[6:] if isinstance(text, str) and text.startswith("fault:") else self.fault

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length)
                if head.startswith(b"GET"):
                    writer.write(_fixed(b'{"object": "list", "data": [{"id": "fault-model"}]}'))
                    continue
                self.posts += 1
                self.arrived.set()
                fault = self._fault_for(body)
                if fault == "ok":
                    writer.write(_fixed(msgspec.json.encode(_CHAT)))
                    continue
                if fault == "huge":
                    writer.write(_head("Content-Length: 200000000\r\n"))
                    for _ in range(3000):  # 200 MB offered; the gateway should hang up long before
                        writer.write(b"x" * 65536)
                        await writer.drain()
                    return
                if fault in WHOLE_FAULTS:
                    writer.write(WHOLE_FAULTS[fault])
                    await writer.drain()
                    return
                data, stall = STREAM_FAULTS[fault]
                writer.write(data)
                await writer.drain()
                if stall:
                    await reader.read()  # until the gateway hangs up
                return
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            self._writers.discard(writer)
            with contextlib.suppress(Exception):
                writer.close()


@pytest.fixture
async def faulty():
    up = await FaultUpstream().start()
    yield up
    await up.stop()


@pytest.fixture(params=["memory", "sqlite"])
def store(request, tmp_path):
    return "memory" if request.param == "memory" else f"sqlite:{tmp_path / 'traces.db'}"


async def _gateway(up: FaultUpstream, store: str, *, lane: bool | str, **kw) -> GatewayServer:
    """``lane``: True (the early lane), False (the task path), "aiohttp" (the task path through
    aiohttp's client, as for https upstreams)."""
    if lane == "aiohttp":
        kw["fast_http"] = False
    cfg = GatewayConfig(upstreams=[up.url], store=store, health_interval_s=0, proxy_lane=lane is True, **kw)
    return await GatewayServer(cfg).start()


async def _post(gw: GatewayServer, sid: str, body: dict) -> tuple[int, bytes]:
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{gw.url}/sessions/{sid}/v1/chat/completions", json=body) as r,
    ):
        return r.status, await r.read()


_BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


async def _assert_one_error_trace(gw: GatewayServer, sid: str, needle: str) -> None:
    (t,) = await gw.local_client().get_traces(sid)
    assert t.status == "error" and needle in t.metadata["error"], t.metadata
    assert gw.inflight == 0


@pytest.mark.parametrize("lane", [True, False, "aiohttp"], ids=["lane", "task", "aiohttp"])
@pytest.mark.parametrize("fault", sorted(WHOLE_FAULTS))
async def test_a_wrong_whole_answer_is_a_prompt_502_with_one_error_trace(faulty, store, lane, fault):
    gw = await _gateway(faulty, store, lane=lane)
    try:
        assert (await _post(gw, "before", _BODY))[0] == 200  # leaves a kept-alive connection (lane)
        faulty.fault = fault
        status, body = await asyncio.wait_for(_post(gw, "bad", _BODY), 30)  # not the 600 s timeout
        assert status == 502, body
        assert b"upstream" in body
        await _assert_one_error_trace(gw, "bad", "upstream")
        faulty.fault = "ok"
        assert (await _post(gw, "after", _BODY))[0] == 200
        client = gw.local_client()
        for sid in ("before", "after"):  # the fault cost no other session anything
            assert [t.status for t in await client.get_traces(sid)] == ["ok"]
    finally:
        await gw.stop()


@pytest.mark.parametrize("lane", [True, False, "aiohttp"], ids=["lane", "task", "aiohttp"])
async def test_an_upstream_answer_over_the_size_limit_is_refused_early(faulty, store, lane):
    gw = await _gateway(faulty, store, lane=lane, max_upstream_body_bytes=1 << 20)
    try:
        await _post(gw, "warm", _BODY)
        faulty.fault = "huge"
        status, body = await asyncio.wait_for(_post(gw, "big", _BODY), 30)
        assert status == 502 and b"exceeds the limit" in body
        await _assert_one_error_trace(gw, "big", "exceeds the limit")
    finally:
        await gw.stop()


async def _stream(gw: GatewayServer, sid: str) -> bytes:
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{gw.url}/sessions/{sid}/v1/chat/completions", json={**_BODY, "stream": True}) as r,
    ):
        assert r.status == 200
        return await r.read()


@pytest.mark.parametrize("fault", sorted(STREAM_FAULTS))
async def test_a_broken_stream_ends_with_an_error_event_and_an_error_trace(faulty, store, fault):
    gw = await _gateway(faulty, store, lane=True, upstream_timeout_s=1.0, max_stream_event_bytes=100_000)
    try:
        faulty.fault = fault
        data = await asyncio.wait_for(_stream(gw, "s"), 30)
        events = [e for e in data.split(b"\n\n") if e]
        assert b'"error"' in events[-2] and events[-1] == b"data: [DONE]", events[-3:]
        await _assert_one_error_trace(gw, "s", "upstream")
    finally:
        await gw.stop()


@pytest.mark.parametrize("lane", [True, False], ids=["lane", "task"])
async def test_concurrent_sessions_with_mixed_faults_each_keep_exactly_their_own_traces(faulty, store, lane):
    """The invariant under load: 8 sessions x 6 calls at once, every other call a fault. Each call
    has exactly one trace, ``ok`` exactly when the client got a 200, in its own session, in order."""
    faults = sorted(WHOLE_FAULTS)
    gw = await _gateway(faulty, store, lane=lane)
    try:
        await _post(gw, "warm", _BODY)

        async def session(i: int) -> list[int]:
            statuses = []
            for turn in range(6):
                text = f"fault:{faults[(i + turn) % len(faults)]}" if (i + turn) % 2 else f"s{i} t{turn}"
                status, _ = await _post(
                    gw, f"s{i}", {"model": "m", "messages": [{"role": "user", "content": text}]}
                )
                statuses.append(status)
            return statuses

        results = await asyncio.wait_for(asyncio.gather(*(session(i) for i in range(8))), 120)
        client = gw.local_client()
        for i, statuses in enumerate(results):
            traces = await client.get_traces(f"s{i}")
            assert [t.seq for t in traces] == list(range(6))
            assert [t.status for t in traces] == ["ok" if s == 200 else "error" for s in statuses]
            assert all(s in (200, 502) for s in statuses)
            assert all(t.session_id == f"s{i}" for t in traces)
        assert gw.inflight == 0
    finally:
        await gw.stop()
