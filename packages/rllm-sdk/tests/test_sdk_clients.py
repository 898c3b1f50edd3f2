"""Per-rollout OpenAI clients: one shared SSL context, session/role base URLs, no retries."""

from __future__ import annotations

import pytest

pytest.importorskip("openai")

from rllm.sdk.clients import async_openai, sync_openai
from rllm.types import AgentConfig


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
