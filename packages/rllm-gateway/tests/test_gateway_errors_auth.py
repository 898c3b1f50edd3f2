"""Bad input and auth: every failure is an OpenAI-style JSON error; no session loses a trace."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import openai
import pytest

from rllm.gateway import GatewayAPIError, GatewayClient, GatewayConfig, GatewayServer


async def _post(url: str, data: bytes, headers: dict | None = None) -> tuple[int, dict]:
    async with (
        aiohttp.ClientSession() as http,
        http.post(url, data=data, headers={"Content-Type": "application/json", **(headers or {})}) as r,
    ):
        return r.status, await r.json()


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        (b"{not json", 400, "malformed JSON"),
        (b"[1, 2]", 400, "JSON object"),
        (b"", 400, "empty"),
        (b'{"model": "m", "messages": "hello"}', 400, "'messages'"),
        (b'{"model": "m", "messages": [{"role": "wizard", "content": "x"}]}', 400, "messages[0].role"),
        (b'{"model": "m", "messages": [{"role": "user", "content": 5}]}', 400, "messages[0].content"),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}',
            400,
            "temperature",
        ),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}', 400, "stream"),
    ],
)
async def test_bad_chat_requests_get_openai_errors(gateway, body, status, needle):
    code, err = await _post(f"{gateway.url}/sessions/bad/v1/chat/completions", body)
    assert code == status
    assert needle in err["error"]["message"] or needle == err["error"]["param"]
    assert err["error"]["type"] == "invalid_request_error"


async def test_bad_completion_prompt(gateway):
    code, err = await _post(
        f"{gateway.url}/sessions/bad/v1/completions", b'{"model": "m", "prompt": [1, "a"]}'
    )
    assert code == 400 and err["error"]["param"] == "prompt"


async def test_body_over_limit_is_413(mock):
    async with GatewayServer(
        GatewayConfig(upstreams=[mock.url], max_body_bytes=4096, health_interval_s=0)
    ) as gw:
        big = b'{"model": "m", "messages": [{"role": "user", "content": "' + b"x" * 10000 + b'"}]}'
        code, err = await _post(f"{gw.url}/sessions/big/v1/chat/completions", big)
        assert code == 413 and "4096" in err["error"]["message"]


async def test_unknown_route_and_method(gateway):
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{gateway.url}/nope") as r:
            assert r.status == 404 and "no route" in (await r.json())["error"]["message"]
        async with http.get(f"{gateway.url}/sessions/x/v1/chat/completions") as r:
            assert r.status == 405 and (await r.json())["error"]["type"] == "invalid_request_error"


async def test_unknown_session_when_auto_create_is_off(mock):
    async with GatewayServer(
        GatewayConfig(upstreams=[mock.url], auto_create_sessions=False, health_interval_s=0)
    ) as gw:
        oc = openai.AsyncOpenAI(base_url=f"{gw.url}/sessions/ghost/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.NotFoundError, match="unknown session"):
            await oc.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])


async def test_upstream_timeout_is_504_and_other_sessions_unaffected(mock, wait_until):
    cfg = GatewayConfig(upstreams=[mock.url], upstream_timeout_s=0.3, health_interval_s=0)
    async with GatewayServer(cfg) as gw, GatewayClient(gw.url) as c:
        mock.fail("hang", count=1)
        slow = openai.AsyncOpenAI(base_url=c.session_url("slow"), api_key="x", max_retries=0)
        fast = openai.AsyncOpenAI(base_url=c.session_url("fast"), api_key="x", max_retries=0)
        hung = asyncio.create_task(
            slow.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        )
        await wait_until(lambda: gw.inflight == 1, what="the hanging call to be in flight")
        ok = await fast.chat.completions.create(model="m", messages=[{"role": "user", "content": "y"}])
        assert ok.choices[0].message.content == "echo: y"
        with pytest.raises(openai.APIStatusError) as e:
            await hung
        assert e.value.status_code == 504
        (t,) = await c.get_traces("slow")
        assert t.status == "error"
        assert [t.status for t in await c.get_traces("fast")] == ["ok"]


async def test_upstream_error_status_is_passed_through(client, mock):
    mock.fail("status", status=400, count=1)
    oc = openai.AsyncOpenAI(base_url=client.session_url("e"), api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="injected"):
        await oc.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    (t,) = await client.get_traces("e")
    assert t.status == "error" and t.metadata["upstream_status"] == 400


async def test_admin_key_and_session_tokens(mock, caplog):
    caplog.set_level(logging.DEBUG)
    admin = "adm-secret-123"
    cfg = GatewayConfig(upstreams=[mock.url], admin_key=admin, session_auth=True, health_interval_s=0)
    async with GatewayServer(cfg) as gw:
        async with GatewayClient(gw.url) as anon:
            with pytest.raises(GatewayAPIError) as e:
                await anon.create_session("a")
            assert e.value.status == 401
        async with GatewayClient(gw.url, admin_key="wrong") as bad:
            with pytest.raises(GatewayAPIError) as e:
                await bad.list_sessions()
            assert e.value.status == 403
        async with GatewayClient(gw.url, admin_key=admin) as c:
            a = await c.create_session("a")
            b = await c.create_session("b")
            ok = openai.AsyncOpenAI(base_url=a.base_url, api_key=a.token, max_retries=0)
            await ok.chat.completions.create(model="m", messages=[{"role": "user", "content": "mine"}])
            # b's token cannot write into a, nor can a stranger create a session by routing to it.
            for url, key in (
                (a.base_url, b.token),
                (a.base_url, "nope"),
                (f"{gw.url}/sessions/new/v1", a.token),
            ):
                oc = openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0)
                with pytest.raises((openai.AuthenticationError, openai.NotFoundError)):
                    await oc.chat.completions.create(
                        model="m", messages=[{"role": "user", "content": "evil"}]
                    )
            # An agent reads its own traces with its token, not another's.
            async with aiohttp.ClientSession() as http:
                async with http.get(
                    f"{gw.url}/sessions/a/traces", headers={"Authorization": f"Bearer {a.token}"}
                ) as r:
                    assert r.status == 200 and len(await r.json()) == 1
                async with http.get(
                    f"{gw.url}/sessions/a/traces", headers={"Authorization": f"Bearer {b.token}"}
                ) as r:
                    assert r.status == 401
                async with http.get(
                    f"{gw.url}/admin/sessions/a/traces", headers={"Authorization": f"Bearer {a.token}"}
                ) as r:
                    assert r.status == 403
            assert [t.messages[0].content for t in await c.get_traces("a")] == ["mine"]
            assert await c.get_traces("b") == []
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert admin not in logged and a.token not in logged


async def test_dropped_connection_is_retried_without_condemning_the_worker(client, gateway, mock):
    mock.fail("die", count=1)  # the upstream closes one connection without answering
    oc = openai.AsyncOpenAI(base_url=client.session_url("drop"), api_key="x", max_retries=0)
    r = await oc.chat.completions.create(model="m", messages=[{"role": "user", "content": "again"}])
    assert r.choices[0].message.content == "echo: again"
    assert gateway.pool.upstreams[mock.url].healthy
    assert [t.status for t in await client.get_traces("drop")] == ["ok"]
