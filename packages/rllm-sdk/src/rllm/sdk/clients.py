"""Cheap OpenAI clients for flows.

A flow asks for a client per rollout (``async with async_openai(config) as client``) and closes it
when the rollout ends. What makes that expensive is not the ``AsyncOpenAI`` object but what hangs
off it: an httpx client with its own SSL context and connection pool (so a NEW TCP connection per
rollout), and openai's per-client platform lookup, run on a worker thread at its first request.
On the toy config of benchmarks/whole_system.py that was about half of the trainer's main thread.

So every async client made on one event loop borrows that loop's shared httpx client (one
keep-alive pool to the gateway, one SSL context, shared by every session): closing a rollout's
``AsyncOpenAI`` leaves the pool open for the next one. What isolates sessions stays per client:
the base URL (the session's, or a role's) and the token, which openai sends with each request;
the pool only carries bytes, and keeps no cookies. A pool is bound to its loop: a loop that is
closed (``asyncio.run`` returned) never hands its pool on. An earlier measurement found one shared pool no better than a client
per rollout (httpx scanned its connections on every request); re-measured with keep-alive in
``benchmarks/RESULTS.md`` (#35 round 5). Sync clients (``sync_openai``) are made per rollout
as before, sharing only the SSL context: they run on worker threads.

``openai`` is an optional dependency (``pip install 'rllm-sdk[openai]'``), imported on first use.
"""

from __future__ import annotations

import asyncio
import functools
import sys
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

from rllm.sdk.session import role_url
from rllm.types import AgentConfig
from rllm.types.errors import StateError

_TIMEOUT_S = 600.0

# (method, path, raw query, lower-cased headers, body) -> (status, headers, body), or None: use TCP.
InProcessHandler = Callable[
    [str, str, str, dict[str, str], bytes], Awaitable[tuple[int, dict[str, str], bytes] | None]
]

# loop -> its shared async httpx client (a closed loop's entry is dropped when a new pool is made).
_POOLS: dict[asyncio.AbstractEventLoop, Any] = {}


def async_openai(config: AgentConfig, role: str | None = None, **kwargs: Any) -> Any:
    """An ``openai.AsyncOpenAI`` for this rollout's session (or one of its roles).

    Made inside a running event loop, it shares that loop's connection pool (see the module
    docstring); outside one (a loop not started yet), it gets a pool of its own, as before.
    """
    from openai import AsyncOpenAI

    if "http_client" in kwargs:  # the caller's own transport: leave it to them
        return AsyncOpenAI(**_client_args(config, role, kwargs))
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    http = _loop_pool(loop) if loop is not None else _own_async_http()
    client = AsyncOpenAI(**_client_args(config, role, kwargs), http_client=http)
    _skip_platform_lookup(client)
    return client


def sync_openai(config: AgentConfig, role: str | None = None, **kwargs: Any) -> Any:
    """An ``openai.OpenAI`` for sync flows; close it (``with``) when the rollout ends."""
    from openai import DefaultHttpxClient, OpenAI

    if "http_client" in kwargs:
        return OpenAI(**_client_args(config, role, kwargs))
    http = DefaultHttpxClient(verify=_shared_ssl_context(), timeout=_TIMEOUT_S)
    client = OpenAI(**_client_args(config, role, kwargs), http_client=http)
    _skip_platform_lookup(client)
    return client


def _loop_pool(loop: asyncio.AbstractEventLoop) -> Any:
    http = _POOLS.get(loop)
    if http is None:
        # A closed loop's pool can never serve again (its connections belong to that loop); its
        # entry keeps the loop alive (the connections refer to it), so drop it here.
        for old in [old for old in _POOLS if old.is_closed()]:
            del _POOLS[old]
        from openai import DEFAULT_CONNECTION_LIMITS

        http = _POOLS[loop] = _shared_client_class()(
            verify=_shared_ssl_context(),
            timeout=_TIMEOUT_S,
            # No cap on open connections, as when each rollout had its own pool: a cap would
            # queue rollouts' requests in the client instead of at the model. Idle ones are kept
            # for the next rollouts (the gateway keeps them 75 s, longer than this 5 s).
            limits=type(DEFAULT_CONNECTION_LIMITS)(
                max_connections=None, max_keepalive_connections=512, keepalive_expiry=5.0
            ),
            # Sessions share the pool, never state: a cookie one server sets must not travel
            # with another session's requests.
            cookies=_no_cookies(),
        )
        # httpx keeps its transport in ``_transport`` (the one it built from verify and limits).
        http._transport = _InProcessRouter(http._transport)
    return http


# (loop, origin) -> an in-process handler for calls to that origin (serve_in_process).
_IN_PROCESS: dict[tuple[asyncio.AbstractEventLoop, str], InProcessHandler] = {}


def serve_in_process(url: str, handler: InProcessHandler) -> Callable[[], None]:
    """Answer this loop's async clients' calls to ``url``'s origin with ``handler``, not TCP.

    For a server that runs on the same event loop as the flows (the engine's embedded gateway,
    see ``rllm.gateway.inprocess``). ``handler(method, path, raw_query, headers, body)`` returns
    ``(status, headers, body)``, or None to send that call over the network after all. Returns
    the function that ends it (call it before the server stops).
    """
    key = (asyncio.get_running_loop(), _origin(url))
    if key in _IN_PROCESS:
        raise StateError(f"{key[1]} is already served in process on this event loop")
    _IN_PROCESS[key] = handler

    def stop() -> None:
        if _IN_PROCESS.get(key) is handler:
            del _IN_PROCESS[key]

    return stop


def _origin(url: str) -> str:
    parts = urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme, 0)
    return f"{parts.scheme}://{(parts.hostname or '').lower()}:{port}"


class _InProcessRouter:
    """The shared pool's transport: a call to an origin served in process goes to its handler,
    every other call to the network transport (httpx's, kept as it was built)."""

    def __init__(self, network: Any) -> None:
        self.network = network

    async def handle_async_request(self, request: Any) -> Any:
        if _IN_PROCESS:
            url = request.url
            port = url.port or {"http": 80, "https": 443}.get(url.scheme, 0)
            handler = _IN_PROCESS.get((asyncio.get_running_loop(), f"{url.scheme}://{url.host}:{port}"))
            if handler is not None:
                body = await request.aread()
                headers = {k.lower(): v for k, v in request.headers.items()}
                answer = await handler(request.method, url.path, url.query.decode("ascii"), headers, body)
                if answer is not None:
                    status, out, content = answer
                    # httpx's Response or httpx2's: whichever library made the request.
                    response_class = sys.modules[type(request).__module__].Response
                    return response_class(status, headers=out, content=content, request=request)
        return await self.network.handle_async_request(request)

    async def aclose(self) -> None:
        await self.network.aclose()

    async def __aenter__(self) -> _InProcessRouter:
        await self.network.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.network.__aexit__(*exc)


def _no_cookies() -> Any:
    from http.cookiejar import CookieJar, DefaultCookiePolicy

    return CookieJar(policy=DefaultCookiePolicy(allowed_domains=[]))


def _own_async_http() -> Any:
    from openai import DefaultAsyncHttpxClient

    # openai's own client class: httpx's before openai 3, httpx2's since.
    return DefaultAsyncHttpxClient(verify=_shared_ssl_context(), timeout=_TIMEOUT_S)


@functools.cache
def _shared_client_class() -> type:
    from openai import DefaultAsyncHttpxClient

    class SharedAsyncHttpClient(DefaultAsyncHttpxClient):
        """An httpx client that a rollout's ``close()`` leaves open: the pool outlives rollouts."""

        async def aclose(self) -> None:
            # AsyncOpenAI.close() (the flow's ``async with``) lands here: not the pool's end.
            return None

    return SharedAsyncHttpClient


@functools.cache
def _shared_ssl_context() -> Any:
    import ssl

    return ssl.create_default_context()


@functools.cache
def _platform() -> Any:
    """openai's platform description, looked up once per process instead of once per client.

    openai runs ``get_platform`` (which reads /etc/os-release) on a worker thread at each client's
    first request; the answer is the same for every client of the process.
    """
    from openai import _base_client

    return _base_client.get_platform()


def _skip_platform_lookup(client: Any) -> None:
    # A private attribute of openai's client: set only where it exists and is still unset, so an
    # openai that drops it just does its own lookup again.
    if getattr(client, "_platform", "absent") is None:
        client._platform = _platform()


def _client_args(config: AgentConfig, role: str | None, kwargs: dict[str, Any]) -> dict[str, Any]:
    base_url = role_url(config, role) if role else config.base_url
    return {"base_url": base_url, "api_key": config.api_key or "EMPTY", "max_retries": 0, **kwargs}
