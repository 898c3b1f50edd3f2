"""Cheap OpenAI clients for flows.

Building an ``openai.AsyncOpenAI`` from scratch creates an httpx client and a fresh SSL context,
so a flow that does that per rollout spends more time building clients than talking to the
model (figures in benchmarks/RESULTS.md). One pool shared by hundreds of concurrent rollouts is
no better: httpx scans its connections on every request. So each rollout gets its own small
client, all of them sharing one SSL context, which is most of a client's cost: httpx builds a
new one per client otherwise, even with ``verify=False`` for plain-HTTP URLs. Close it when the
rollout ends (``async with async_openai(config) as client``).

``openai`` is an optional dependency (``pip install 'rllm-sdk[openai]'``), imported on first use.
"""

from __future__ import annotations

import functools
from typing import Any

from rllm.sdk.session import role_url
from rllm.types import AgentConfig

_TIMEOUT_S = 600.0


def async_openai(config: AgentConfig, role: str | None = None, **kwargs: Any) -> Any:
    """An ``openai.AsyncOpenAI`` for this rollout's session (or one of its roles)."""
    from openai import AsyncOpenAI, DefaultAsyncHttpxClient

    # openai's own client class: httpx's before openai 3, httpx2's since.
    http = DefaultAsyncHttpxClient(verify=_shared_ssl_context(), timeout=_TIMEOUT_S)
    return AsyncOpenAI(**_client_args(config, role, kwargs), http_client=http)


def sync_openai(config: AgentConfig, role: str | None = None, **kwargs: Any) -> Any:
    """An ``openai.OpenAI`` for sync flows; close it (``with``) when the rollout ends."""
    from openai import DefaultHttpxClient, OpenAI

    http = DefaultHttpxClient(verify=_shared_ssl_context(), timeout=_TIMEOUT_S)
    return OpenAI(**_client_args(config, role, kwargs), http_client=http)


@functools.cache
def _shared_ssl_context() -> Any:
    import ssl

    return ssl.create_default_context()


def _client_args(config: AgentConfig, role: str | None, kwargs: dict[str, Any]) -> dict[str, Any]:
    base_url = role_url(config, role) if role else config.base_url
    return {"base_url": base_url, "api_key": config.api_key or "EMPTY", "max_retries": 0, **kwargs}
