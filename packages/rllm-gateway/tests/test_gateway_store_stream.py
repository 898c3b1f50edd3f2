"""SQLite durability across kill -9 (real subprocess), store parity, config/CLI, streaming aborts."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import aiohttp
import openai
import pytest

from rllm.gateway import GatewayClient, GatewayConfig, GatewayServer, SqliteTraceStore, load_config
from rllm.gateway.trace_query import TraceQuery
from rllm.types import ConfigError, TraceRecord


async def _start_cli(*args: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rllm.gateway.command",
            "serve",
            "--port",
            "0",
            "--health-interval-s",
            "0",
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = await asyncio.to_thread(proc.stdout.readline)
    if "listening on" not in line:
        proc.kill()
        raise AssertionError(f"gateway did not start: {line!r} {proc.stderr.read()}")
    return proc, line.strip().rsplit(" ", 1)[1]


async def test_committed_traces_survive_kill_9(tmp_path, mock):
    db = tmp_path / "traces.db"
    proc, url = await _start_cli("--upstream", mock.url, "--store", f"sqlite:{db}", "--admin-key", "k")
    try:
        async with GatewayClient(url, admin_key="k") as c:
            s = await c.create_session("durable")
            oc = openai.AsyncOpenAI(base_url=s.base_url, api_key=s.token)
            for i in range(3):
                await oc.chat.completions.create(model="m", messages=[{"role": "user", "content": f"t{i}"}])
            await c.flush()
            before = await c.get_traces("durable")
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    proc, url = await _start_cli("--upstream", mock.url, "--store", f"sqlite:{db}", "--admin-key", "k")
    try:
        async with GatewayClient(url, admin_key="k") as c:
            after = await c.get_traces("durable")
            assert [t.id for t in after] == [t.id for t in before]
            assert [list(t.completion_ids) for t in after] == [list(t.completion_ids) for t in before]
            # The session (and its token) came back; its seq continues.
            oc = openai.AsyncOpenAI(base_url=c.session_url("durable"), api_key=s.token)
            await oc.chat.completions.create(model="m", messages=[{"role": "user", "content": "t3"}])
            assert [t.seq for t in await c.get_traces("durable")] == [0, 1, 2, 3]
    finally:
        proc.terminate()
        proc.wait()


@pytest.mark.parametrize("store", ["memory", "sqlite"])
async def test_store_protocol(tmp_path, store):
    from rllm.gateway import open_store

    st = open_store("memory" if store == "memory" else f"sqlite:{tmp_path / 's.db'}")
    for i in (2, 0, 1):
        st.put(
            TraceRecord(
                session_id="a",
                seq=i,
                role="r" if i else "default",
                completion_ids=[i],
                completion_logprobs=[-0.5],
            )
        )
    st.put(TraceRecord(session_id="b", seq=0))
    assert [r.seq for r in await st.get("a")] == [0, 1, 2]
    assert len(await st.query(TraceQuery(role="r"))) == 2 and len(await st.query(TraceQuery(limit=1))) == 1
    assert st.trace_count() == 4
    assert await st.delete_session("a") == 3
    assert st.trace_count() == 1 and await st.get("a") == []
    await st.close()


async def test_sqlite_gateway_end_to_end(tmp_path, mock):
    cfg = GatewayConfig(upstreams=[mock.url], store=f"sqlite:{tmp_path / 'g.db'}", health_interval_s=0)
    async with GatewayServer(cfg) as gw, GatewayClient(gw.url) as c:
        assert isinstance(gw.store, SqliteTraceStore)
        oc = openai.AsyncOpenAI(base_url=c.session_url("s"), api_key="x")
        await asyncio.gather(
            *(
                oc.chat.completions.create(model="m", messages=[{"role": "user", "content": str(i)}])
                for i in range(20)
            )
        )
        traces = await c.get_traces("s")
        assert sorted(t.seq for t in traces) == list(range(20)) and [t.seq for t in traces] == list(range(20))
        assert {t.response.content for t in traces} == {f"echo: {i}" for i in range(20)}


def test_config_file_and_flags(tmp_path):
    f = tmp_path / "gw.toml"
    f.write_text('[gateway]\nport = 9000\nupstreams = ["http://127.0.0.1:1/v1"]\nstore = "memory"\n')
    cfg = load_config(f, port=9100, admin_key=None)
    assert cfg.port == 9100 and cfg.upstreams == ["http://127.0.0.1:1/v1"]
    y = tmp_path / "gw.yaml"
    y.write_text("session_auth: true\nadmin_key: k\n")
    assert load_config(y).session_auth is True
    bad = tmp_path / "bad.toml"
    bad.write_text('store = "redis://x"\n')
    with pytest.raises(ConfigError, match="store") as err:
        load_config(bad)
    assert err.value.key == "store" and str(bad) in str(err.value)
    with pytest.raises(ConfigError, match="upstreams") as err:
        load_config(None, upstreams=["localhost:8000"])
    assert err.value.key == "upstreams[0]"
    with pytest.raises(ConfigError, match="unknown") as err:
        load_config(None, colour="red")
    assert err.value.key == "colour"
    old = tmp_path / "old.toml"
    old.write_text("max_connections_per_worker = 8\n")  # the key's name before "upstreams" throughout
    with pytest.raises(ConfigError, match="renamed to max_connections_per_upstream") as err:
        load_config(old)
    assert err.value.key == "max_connections_per_worker"
    j = tmp_path / "gw.json"
    j.write_text('{"gateway": {"port": 9001}}')
    assert load_config(j).port == 9001
    with pytest.raises(ConfigError, match=r"\.toml, \.yaml, \.yml, \.json"):
        load_config(tmp_path / "gw.ini")


def test_cli_rejects_bad_config(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "rllm.gateway.command", "serve", "--store", "nope"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "store" in r.stderr


async def test_client_disconnect_mid_stream_cancels_upstream_and_leaves_abort_trace(client, mock, wait_until):
    mock.chunk_delay = 0.05
    url = client.session_url("ab") + "/chat/completions"
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "a fairly long reply please"}],
        "stream": True,
    }
    async with aiohttp.ClientSession() as http:
        resp = await http.post(url, json=body)
        first = await resp.content.readany()  # bytes arrive before the reply is complete
        assert first.startswith(b"data: ")
        while len(first) < 600:  # a few token chunks, then hang up
            first += await resp.content.readany()
        resp.close()  # the client goes away
    traces = []

    async def aborted() -> bool:
        nonlocal traces
        traces = await client.get_traces("ab")
        return bool(traces) and mock.stats.cancelled > 0

    await wait_until(aborted, what="the abort trace and the upstream's cancel")
    (t,) = traces
    assert t.status == "abort"
    assert 0 < len(t.completion_ids) < len("echo: a fairly long reply please")
    assert mock.stats.cancelled == 1


async def test_upstream_dying_mid_stream_marks_error_and_keeps_partial(client, mock):
    mock.fail("die_mid_stream")
    oc = openai.AsyncOpenAI(base_url=client.session_url("die"), api_key="x", max_retries=0)
    stream = await oc.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "x" * 20}], stream=True
    )
    with pytest.raises(openai.APIError):
        async for _ in stream:
            pass
    (t,) = await client.get_traces("die")
    assert t.status == "error" and len(t.completion_ids) > 0
