"""Flows' OpenAI clients: one SSL context, session/role base URLs, no retries; one shared client
per loop for an origin served in process (the engine's gateway), a pool per client otherwise."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("openai")

from rllm.sdk import clients
from rllm.sdk.clients import async_openai, sync_openai
from rllm.types import AgentConfig
from rllm.types.errors import StateError


def _ssl_context(client):  # httpx's transport -> httpcore's pool keeps the context it was given
    return client._client._transport._pool._ssl_context


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


async def test_clients_for_an_origin_served_in_process_share_one_client_and_keep_their_session():
    server = _Server()
    root = await server.start()
    handled: list[tuple[str, str]] = []

    async def handler(method, path, raw_query, headers, body):
        handled.append((path, headers["authorization"]))
        if "/s3/" in path or "/s5/" in path:
            return None  # not taken (as a stream is not): the call goes over TCP after all
        return 200, {"content-type": "application/json"}, _REPLY

    stop = clients.serve_in_process(root, handler)
    try:
        shared = []
        for sid in ("s1", "s2", "s3"):  # three rollouts, one after the other, each closing its client
            config = AgentConfig(base_url=f"{root}/sessions/{sid}/v1", api_key=f"tok-{sid}")
            async with async_openai(config) as c:
                await _ask(c)
                shared.append(c._client)
        judge = async_openai(AgentConfig(base_url=f"{root}/sessions/s4/v1", api_key="tok-s4"), role="judge")
        await _ask(judge)
        await _ask(async_openai(AgentConfig(base_url=f"{root}/sessions/s5/v1", api_key="tok-s5")))
        other = async_openai(AgentConfig(base_url="http://127.0.0.1:9/v1"))  # an origin not served
        assert shared[0] is shared[1] is shared[2] is judge._client is not other._client
    finally:
        stop()
        await server.stop()
    assert async_openai(AgentConfig(base_url=root))._client is not shared[0]  # served no more
    # Each call went to its own session URL with its own token (one the handler did not take was
    # offered twice: by rllm.sdk.fast_chat, then by openai's own path through the shared client) ...
    assert handled == [
        ("/sessions/s1/v1/chat/completions", "Bearer tok-s1"),
        ("/sessions/s2/v1/chat/completions", "Bearer tok-s2"),
        ("/sessions/s3/v1/chat/completions", "Bearer tok-s3"),
        ("/sessions/s3/v1/chat/completions", "Bearer tok-s3"),
        ("/sessions/s4/roles/judge/v1/chat/completions", "Bearer tok-s4"),
        ("/sessions/s5/v1/chat/completions", "Bearer tok-s5"),
        ("/sessions/s5/v1/chat/completions", "Bearer tok-s5"),
    ]
    # ... the two the handler did not take went over TCP, and the cookie the server set on the
    # first of them did not travel with the other session's call.
    assert [(r["path"], r["authorization"]) for r in server.requests] == [
        ("/sessions/s3/v1/chat/completions", "Bearer tok-s3"),
        ("/sessions/s5/v1/chat/completions", "Bearer tok-s5"),
    ]
    assert not any("cookie" in r for r in server.requests)


async def test_an_origin_is_served_in_process_once_per_loop():
    stop = clients.serve_in_process("http://127.0.0.1:9", _never)
    try:
        with pytest.raises(StateError, match="already served"):
            clients.serve_in_process("http://127.0.0.1:9/sessions/x/v1", _never)
    finally:
        stop()


async def _never(*args):
    raise AssertionError("not called")


def test_a_closed_loops_shared_client_is_not_reused():
    config = AgentConfig(base_url="http://127.0.0.1:9/v1")

    async def shared():
        stop = clients.serve_in_process(config.base_url, _never)
        try:
            return asyncio.get_running_loop(), async_openai(config)._client
        finally:
            stop()

    first_loop, first = asyncio.run(shared())
    _, second = asyncio.run(shared())  # a new loop: the first one is closed
    assert first is not second
    assert first_loop not in clients._POOLS  # its entry (which holds the loop alive) is gone


async def test_clients_skip_openais_per_client_platform_lookup():
    # openai looks the platform up on a worker thread at each client's first request while it is unset.
    client = async_openai(AgentConfig(base_url="http://127.0.0.1:9/v1"))
    assert (
        client._platform is not None and client._platform is async_openai(AgentConfig(base_url="x"))._platform
    )


async def test_a_copied_client_equals_a_constructed_one():
    # async_openai copies a template instead of running openai's constructor per rollout: the copy
    # must hold exactly what the constructor would give (an openai that adds state fails here).
    expected = {
        "http://127.0.0.1:9/sessions/s1/v1": "http://127.0.0.1:9/sessions/s1/roles/judge/v1/",
        "https://example.invalid/sessions/s2/v1/": "https://example.invalid/sessions/s2/roles/judge/v1/",
    }
    for base_url, judge_url in expected.items():
        config = AgentConfig(base_url=base_url, api_key="tok-1")
        copied = async_openai(config, role="judge")
        built = clients._new_client(clients._client_args(config, "judge", {}), copied._client)
        assert type(copied) is type(built)
        assert vars(copied).keys() == vars(built).keys()
        for key, value in vars(built).items():
            assert vars(copied)[key] == value, key
        assert str(copied.base_url) == judge_url
        assert copied.auth_headers == {"Authorization": "Bearer tok-1"}
        # Each copy owns its dicts: a change to one is no other client's.
        other = async_openai(config)
        assert copied._custom_headers is not other._custom_headers
        assert copied._custom_query is not clients._template_client()._custom_query
        await copied.close()
        await other.close()


def test_a_copy_puts_the_trailing_slash_where_openai_does():
    http = clients._template_client()._client  # (an idle pool that is never used)
    for url in (
        "http://h:1/v1",
        "http://h:1/v1/",
        "http://h:1/v1?x=1",
        "http://h:1/a%20b/v1#f",
        "http://h:1",
    ):
        built = clients._new_client({"base_url": url, "api_key": "k", "max_retries": 0}, http)
        assert str(clients._copy_client(url, "k", http).base_url) == str(built.base_url), url


_segment = st.text(alphabet="abz09-._~%:@", min_size=1, max_size=5)
_urls = st.builds(
    lambda scheme, host, port, segments, slash, tail: (
        f"{scheme}://{host}{port}" + "".join("/" + s for s in segments) + slash + tail
    ),
    st.sampled_from(["http", "https"]),
    st.sampled_from(["h.example", "H.Example", "127.0.0.1", "u:p@h.example", "[::1]", "xn--bcher-kva.ch"]),
    st.sampled_from(["", ":1", ":8080", ":80", ":443"]),
    st.lists(_segment, max_size=3),
    st.sampled_from(["", "/"]),
    st.sampled_from(["", "?x=1", "#f", "?a=/b#c"]),
)


@settings(max_examples=300, deadline=None)
@given(_urls)
def test_a_copys_base_url_is_the_constructors_for_any_url(url):
    http = clients._template_client()._client  # (an idle pool that is never used)
    built = clients._new_client({"base_url": url, "api_key": "k", "max_retries": 0}, http)
    copied = clients._copy_client(url, "k", http).base_url
    # The same parse, not only the same text (a plain URL's is made from its origin's).
    assert (str(copied), copied._uri_reference) == (str(built.base_url), built.base_url._uri_reference)


async def test_extra_options_still_go_through_openais_constructor():
    client = async_openai(
        AgentConfig(base_url="http://127.0.0.1:9/v1"), default_headers={"X-A": "1"}, max_retries=3
    )
    assert client.max_retries == 3 and client._custom_headers == {"X-A": "1"}
    assert client._platform is clients._platform()
    await client.close()


def test_idempotency_keys_are_unique_under_threads():
    from concurrent.futures import ThreadPoolExecutor

    client = clients._flow_client_class()(base_url="http://127.0.0.1:9/v1", api_key="k")

    def keys(_: int) -> list[str]:
        return [client._idempotency_key() for _ in range(2000)]

    with ThreadPoolExecutor(8) as pool:
        got = [k for ks in pool.map(keys, range(8)) for k in ks]
    assert len(set(got)) == len(got) == 16000
    # openai's AsyncOpenAI sends no idempotency header, so the key never reaches the gateway.
    assert client._idempotency_header is None
