"""Property-based tests (hypothesis): random request framings and random JSON shapes and depths,
against the real HTTP server and the capture path. Bounded: few examples, each under a
generous deadline, so they run in CI on a busy machine."""

from __future__ import annotations

import asyncio
import itertools
from datetime import timedelta
from types import SimpleNamespace

import httptools
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rllm.gateway import GatewayConfig, GatewayServer
from rllm.gateway.capture import StreamCapture, UpstreamShapeError, read_answer
from rllm.gateway.sse import EventTooLarge, SseEvents, StreamFault, decode_chunk, upstream_chunks
from rllm.gateway.toolcalls import same_tool_calls
from rllm.gateway.traces import fill_trace
from rllm.types import TraceRecord, from_msgpack, to_msgpack

_NET = settings(
    max_examples=25,
    deadline=timedelta(seconds=20),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
_PURE = settings(max_examples=150, deadline=timedelta(seconds=5))


@pytest.fixture
async def gw(mock):
    cfg = GatewayConfig(upstreams=[mock.url], health_interval_s=0, max_json_depth=32)
    server = await GatewayServer(cfg).start()
    yield server
    await server.stop()


# ------------------------------------------------------------------ request framing
_CHAT = msgspec.json.encode({"model": "m", "messages": [{"role": "user", "content": "hi"}]})


def _request(kind: str, sid: str) -> tuple[bytes, int]:
    """One request's bytes and the status it must get."""
    if kind == "health":
        return b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", 200
    path = f"/sessions/{sid}/v1/chat/completions".encode()
    if kind == "chat":
        return b"POST %b HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%b" % (path, len(_CHAT), _CHAT), 200
    if kind == "chunked":
        half = len(_CHAT) // 2
        body = b"%x\r\n%b\r\n%x\r\n%b\r\n0\r\n\r\n" % (half, _CHAT[:half], len(_CHAT) - half, _CHAT[half:])
        return b"POST %b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n%b" % (path, body), 200
    bad = b'{"model": "m", "messages": ' + b"[" * 40 + b"]" * 40 + b"}"  # deeper than the limit
    return b"POST %b HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%b" % (path, len(bad), bad), 400


_SESSIONS = itertools.count()


class _Statuses:
    def __init__(self) -> None:
        self.seen: list[int] = []
        self.parser = httptools.HttpResponseParser(self)

    def on_message_complete(self) -> None:
        self.seen.append(self.parser.get_status_code())


@_NET
@given(
    kinds=st.lists(st.sampled_from(["health", "chat", "chunked", "too_deep"]), min_size=1, max_size=5),
    garbage=st.booleans(),
    cuts=st.lists(st.integers(min_value=1, max_value=400), max_size=12),
)
async def test_any_framing_of_pipelined_requests_is_answered_whole_and_in_order(gw, kinds, garbage, cuts):
    sid = f"f{next(_SESSIONS)}"  # a fresh session per example
    parts = [_request(k, sid) for k in kinds]
    stream = b"".join(p for p, _ in parts)
    expected = [s for _, s in parts]
    if garbage:
        stream += b"\x00GARBAGE\r\n\r\n"
        expected.append(400)
    else:  # the last request asks to close, so the read below ends
        last = _request(kinds[-1], sid)[0]
        stream = stream[: -len(last)] + last.replace(b"Host: x\r\n", b"Host: x\r\nConnection: close\r\n", 1)
    reader, writer = await asyncio.open_connection(gw.host, gw.port)
    pos = 0
    for cut in cuts:  # the same bytes, cut into arbitrary writes
        if pos >= len(stream):
            break
        writer.write(stream[pos : pos + cut])
        await writer.drain()
        pos += cut
    writer.write(stream[pos:])
    raw = await asyncio.wait_for(reader.read(-1), 60)
    writer.close()
    got = _Statuses()
    got.parser.feed_data(raw)
    assert got.seen == expected
    traces = await gw.local_client().get_traces(sid)
    assert len(traces) == sum(k in ("chat", "chunked") for k in kinds)
    assert all(t.status == "ok" for t in traces)


# ------------------------------------------------------------------ JSON shapes and depths
_SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8)


def _nest(value, depth: int, as_list: bool):
    for _ in range(depth):
        value = [value] if as_list else {"k": value}
    return value


_JSON = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)


@_NET
@given(
    field=st.sampled_from(["metadata", "tools", "user", "response_format", "messages"]),
    value=_JSON,
    depth=st.integers(min_value=0, max_value=80),
    as_list=st.booleans(),
)
async def test_any_json_body_gets_an_answer_never_a_500_and_the_store_stays_readable(
    gw, field, value, depth, as_list
):
    import aiohttp

    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], field: _nest(value, depth, as_list)}
    raw = msgspec.json.encode(body)
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{gw.url}/sessions/j/v1/chat/completions", data=raw) as r,
    ):
        assert r.status in (200, 400), await r.text()
        if r.status == 400:
            assert (await r.json())["error"]["message"]
    async with aiohttp.ClientSession() as http, http.get(f"{gw.url}/sessions/j/traces?format=msgpack") as r:
        assert r.status == 200
        from_msgpack(await r.read(), list[TraceRecord])


# ------------------------------------------------------------------ the capture path
# Tool calls close to the real shape, so the search reaches the malformed-but-plausible ones (a
# missing id, a function that is a string, a name that is a number) and not only random JSON.
_TOOL_CALL = st.fixed_dictionaries(
    {},
    optional={
        "index": _JSON | st.integers(0, 2),
        "id": _JSON | st.text(max_size=4),
        "type": _JSON,
        "function": _JSON
        | st.fixed_dictionaries(
            {}, optional={"name": _JSON | st.text(max_size=4), "arguments": _JSON | st.text(max_size=4)}
        ),
    },
)
_TOOL_CALLS = _JSON | st.lists(_TOOL_CALL | _JSON, max_size=3)
_CHOICE = st.fixed_dictionaries(
    {},
    optional={
        "message": _JSON | st.fixed_dictionaries({}, optional={"content": _JSON, "tool_calls": _TOOL_CALLS}),
        "token_ids": _JSON | st.lists(st.integers(), max_size=5),
        "prompt_token_ids": _JSON | st.lists(st.integers(), max_size=5),
        "logprobs": _JSON
        | st.fixed_dictionaries(
            {"content": st.lists(st.dictionaries(st.just("logprob"), _SCALARS), max_size=5)}
        ),
        "finish_reason": _JSON,
        "text": _JSON,
        "delta": _JSON | st.fixed_dictionaries({}, optional={"content": _JSON, "tool_calls": _TOOL_CALLS}),
        "index": _JSON,
    },
)
_ANSWER = _JSON | st.fixed_dictionaries(
    {},
    optional={
        "choices": _JSON | st.lists(_CHOICE | _JSON, max_size=2),
        "usage": _JSON,
        "model": _JSON,
        "prompt_token_ids": _JSON,
        "meta_info": _JSON,
    },
)


def _stored(cap) -> None:
    """What the gateway does with a capture it accepted: fill a trace and encode it."""
    trace = TraceRecord(session_id="s")
    fill_trace(trace, cap)
    from_msgpack(to_msgpack(trace), TraceRecord)
    # what the next turn does with them: an agent echoing the calls back is matched by key
    echoed = [
        SimpleNamespace(
            id=c["id"],
            function=SimpleNamespace(name=c["function"]["name"], arguments=c["function"]["arguments"]),
        )
        for c in cap.tool_calls
    ]
    assert same_tool_calls(echoed, cap.tool_calls)


@_PURE
@given(answer=_ANSWER, chat=st.booleans())
def test_any_upstream_answer_is_captured_or_refused_with_a_shape_error(answer, chat):
    try:
        cap = read_answer(answer, chat=chat)
    except UpstreamShapeError as exc:
        assert str(exc)
        return
    _stored(cap)


@_PURE
@given(calls=st.lists(_TOOL_CALL | _JSON, max_size=3), streamed=st.booleans())
def test_any_tool_calls_an_upstream_returns_are_usable_or_refused_with_a_shape_error(calls, streamed):
    """The tool calls alone, whole or as stream deltas: a malformed one is the upstream's named
    error (a 502), never a KeyError later when the next turn echoes it (a 500)."""
    try:
        if streamed:
            sc = StreamCapture(chat=True)
            sc.feed({"choices": [{"index": 0, "delta": {"tool_calls": calls}}]})
            cap = sc.checked_result()
        else:
            cap = read_answer({"choices": [{"message": {"tool_calls": calls}}]}, chat=True)
    except UpstreamShapeError as exc:
        assert str(exc)
        return
    _stored(cap)


@_PURE
@given(chunks=st.lists(_ANSWER, max_size=4), chat=st.booleans())
def test_any_stream_of_chunks_is_captured_or_refused_with_a_shape_error(chunks, chat):
    sc = StreamCapture(chat=chat)
    try:
        for chunk in chunks:
            if isinstance(chunk, dict):
                sc.feed(chunk)
        cap = sc.checked_result()
    except UpstreamShapeError:
        return
    _stored(cap)


# ------------------------------------------------------------------ SSE event splitting
_EVENT_DATA = st.binary(max_size=300).map(lambda b: b.replace(b"\n", b"").replace(b"\r", b""))


@_PURE
@given(
    payloads=st.lists(_EVENT_DATA.filter(bool), max_size=8),
    cuts=st.lists(st.integers(min_value=1, max_value=64), max_size=40),
    crlf=st.booleans(),
)
def test_sse_events_come_out_whole_and_in_order_however_the_bytes_are_cut(payloads, cuts, crlf):
    eol = b"\r\n" if crlf else b""
    wire = b"".join(b": comment" + eol + b"\ndata: " + p + eol + b"\n\n" for p in payloads)
    events = SseEvents(max_event_bytes=1 << 20)
    got: list[bytes] = []
    pos = 0
    for cut in cuts:
        got += events.feed(wire[pos : pos + cut])
        pos += cut
    got += events.feed(wire[pos:])
    assert got == payloads


async def _pieces(wire: bytes, cuts: list[int]):
    pos = 0
    for cut in cuts:
        yield wire[pos : pos + cut]
        pos += cut
    yield wire[pos:]


async def _drain(chunks) -> list[bytes]:
    return [p async for p in chunks]


@_PURE
@given(
    payloads=st.lists(_EVENT_DATA.filter(lambda b: bool(b) and b != b"[DONE]"), max_size=8),
    cuts=st.lists(st.integers(min_value=1, max_value=64), max_size=40),
    done=st.booleans(),
)
def test_the_relays_one_loop_yields_each_event_up_to_done_and_faults_a_stream_cut_short(payloads, cuts, done):
    """``upstream_chunks`` (what both the stream relay and the partial-stream relay iterate):
    every event before ``[DONE]``, nothing after it; a stream without it is a StreamFault."""
    wire = b"".join(b"data: " + p + b"\n\n" for p in payloads)
    if done:
        wire += b"data: [DONE]\n\ndata: after\n\n"
    chunks = upstream_chunks(_pieces(wire, cuts), 1 << 20)
    if done:
        assert asyncio.run(_drain(chunks)) == payloads
    else:
        with pytest.raises(StreamFault, match=r"closed the stream before \[DONE\]"):
            asyncio.run(_drain(chunks))


def test_the_relays_one_loop_names_what_it_cannot_take():
    too_big = upstream_chunks(_pieces(b"data: " + b"x" * 2000, [100] * 5), 1000)
    with pytest.raises(StreamFault, match="max_stream_event_bytes"):
        asyncio.run(_drain(too_big))
    with pytest.raises(StreamFault, match="not JSON"):
        decode_chunk(b"{nope")
    with pytest.raises(StreamFault, match="a JSON list"):
        decode_chunk(b"[1]")
    assert decode_chunk(b'{"choices": []}') == {"choices": []}


def test_an_sse_event_over_the_limit_is_an_error_not_memory():
    events = SseEvents(max_event_bytes=1000)
    events.feed(b"data: " + b"x" * 900)
    with pytest.raises(EventTooLarge):
        events.feed(b"x" * 200)
