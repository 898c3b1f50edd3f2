"""Cheap OpenAI clients for flows.

A flow asks for a client per rollout (``async with async_openai(config) as client``) and closes it
when the rollout ends. Building an httpx client from scratch creates a fresh SSL context, so every
client shares one. Over TCP each rollout keeps its own small pool: one pool shared by the
concurrent rollouts of a loop was measured no better (benchmarks/flow_calls.py: 1.08x the CPU per
rollout, benchmarks/history/issue-35.md, "#35 round 5"; httpx scans its connections on every
request).

What does pay is not going over TCP at all when the server is in this process on the same loop:
the engine's embedded gateway registers itself with :func:`serve_in_process`, and a client made
on that loop for that gateway's URL borrows the loop's shared in-process client, whose calls the
gateway answers in memory (``rllm.gateway.inprocess``: same routes, token checks and traces;
0.68x the CPU per rollout). Closing a rollout's ``AsyncOpenAI`` leaves that shared client open
for the next rollout. What isolates sessions stays per ``AsyncOpenAI``: the base URL (the
session's, or a role's) and the token, sent with each request; the shared client keeps no
cookies. It is bound to its loop: a closed loop's is never handed on. A call the handler does
not take (a stream) goes over a keep-alive pool of that shared client. Every client skips
openai's per-client platform lookup (a worker-thread hop at its first request): it is looked up
once per process. Sync clients (``sync_openai``) run on worker threads: always over TCP.

``openai`` is an optional dependency (``pip install 'rllm-sdk[openai]'``), imported on first use.
"""

from __future__ import annotations

import asyncio
import functools
import re
import sys
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from rllm.sdk.session import role_url
from rllm.types import AgentConfig
from rllm.types.in_process import serve_in
from rllm.types.openai import response_id

_TIMEOUT_S = 600.0

# (method, path, raw query, lower-cased headers, body) -> (status, headers, body), or None: use TCP.
InProcessHandler = Callable[
    [str, str, str, dict[str, str], bytes], Awaitable[tuple[int, dict[str, str], bytes] | None]
]

# loop -> its shared in-process httpx client (a closed loop's entry is dropped when a new one is made).
_POOLS: dict[asyncio.AbstractEventLoop, Any] = {}


def async_openai(config: AgentConfig, role: str | None = None, **kwargs: Any) -> Any:
    """An ``openai.AsyncOpenAI`` for this rollout's session (or one of its roles).

    Made on an event loop where its URL is served in process, it borrows that loop's shared
    in-process client (see the module docstring); otherwise it has a pool of its own. With no
    extra ``kwargs`` it is a copy of one ready-made client with the session's URL and token set
    (openai's constructor per rollout was ~10% of the event loop's CPU per in-process rollout,
    benchmarks/history/issue-35.md, "#35 round 8 — the flow's call path"; see ``_copy_client``).
    """
    args = _client_args(config, role, kwargs)
    if "http_client" in kwargs:  # the caller's own transport: leave it to them
        return _flow_client_class()(**args)
    base_url = args["base_url"]
    origin = _origin(base_url) if _IN_PROCESS and isinstance(base_url, str) else None
    loop = _served_loop(base_url, origin)
    http = _loop_pool(loop) if loop is not None else _own_async_http()
    if kwargs:  # the caller's own options: openai's constructor reads them
        return _new_client(args, http)
    client = _copy_client(base_url, args["api_key"], http)
    if loop is not None and origin is not None and _PLAIN_PATH.fullmatch(base_url):
        client._rllm_route = _Route(client._base_url, client.api_key, (loop, origin), urlsplit(base_url).path)
    return client


class _Route(NamedTuple):
    """Where a copied client's calls go in process, worked out once when it was made (one-turn
    flows make one call per client: #35 round 11 measured the URL parses and header building of
    ``fast_chat``'s route at ~40 us a call). It holds while the client's base URL object and key
    are the ones it was made with and the other inputs of openai's headers (organization,
    project, custom headers) the template's (``in_process_target``)."""

    url: Any  # the client's httpx URL object when it was made
    api_key: str
    key: tuple[asyncio.AbstractEventLoop, str]  # (loop, origin) in _IN_PROCESS
    path: str  # the base URL's path, without the trailing slash the copy adds


def in_process_target(client: Any) -> tuple[InProcessHandler, str, str] | None:
    """For a client ``async_openai`` copied for an origin served in process on the running loop:
    the handler, the chat completions path and the key its calls are sent with; None where that
    does not hold any more (or never did): work them out from the client then."""
    route = client.__dict__.get("_rllm_route")
    if route is None or client._base_url is not route.url or client.api_key != route.api_key:
        return None
    template = _template_client()  # what its headers came from: openai's inputs to them unchanged?
    if (
        client.organization != template.organization
        or client.project != template.project
        or client._custom_headers != template._custom_headers
    ):
        return None
    handler = _IN_PROCESS.get(route.key)
    if handler is None or route.key[0] is not asyncio.get_running_loop():
        return None
    return handler, route.path + "/chat/completions", route.api_key


def _new_client(args: dict[str, Any], http: Any) -> Any:
    client = _flow_client_class()(**args, http_client=http)
    _skip_platform_lookup(client)
    return client


# A URL whose path httpx leaves as it is (no query, fragment, escapes or dot segments, which it
# normalises) and that has no trailing slash: appending one is then what openai's setter does.
_PLAIN_PATH = re.compile(r"[a-z]+://[^/?#%]+(?:/[A-Za-z0-9_~:@-][A-Za-z0-9_~:@.-]*)+")


def _copy_client(base_url: str, api_key: str, http: Any) -> Any:
    """A client equal to ``_new_client`` with these arguments (and ``max_retries=0``), made by
    copying a template's attributes instead of running openai's constructor (its environment
    reads and checks are the same for every rollout). Each copy gets its own dicts; the test
    ``test_a_copied_client_equals_a_constructed_one`` holds it to a constructed client's state."""
    template = _template_client()
    client = object.__new__(type(template))
    client.__dict__.update({k: dict(v) if type(v) is dict else v for k, v in template.__dict__.items()})
    # openai's setter (normalised, with a trailing slash on the path): given the slash, it parses
    # the URL once instead of twice (httpx's URL parsing is most of what a copy costs); given an
    # httpx URL for a plain one (its origin's parse with the path put in), not at all.
    if _PLAIN_PATH.fullmatch(base_url):
        client.base_url = _plain_url(type(template.base_url), base_url + "/") or base_url + "/"
    else:
        client.base_url = base_url
    client.api_key = api_key
    client._client = http
    return client


def _plain_url(url_class: type, url: str) -> Any | None:
    """``url_class(url)`` for a URL matching ``_PLAIN_PATH`` plus a trailing slash, without parsing
    it: the parse of its origin (made once per origin) with its path put in, which is what the
    parse gives for such a path (nothing to escape or normalise in it). None where httpx keeps its
    parse differently than this expects: then openai's setter parses it."""
    at = url.index("/", url.index("://") + 3)
    origin = _origin_reference(url_class, url[:at])
    if origin is None:
        return None
    made = object.__new__(url_class)
    made._uri_reference = origin._replace(path=url[at:])
    return made


@functools.cache
def _origin_reference(url_class: type, origin: str) -> Any | None:
    """httpx's parse of ``origin + "/"`` (its ``_uri_reference``, a NamedTuple), or None."""
    reference = getattr(url_class(origin + "/"), "_uri_reference", None)
    if not hasattr(reference, "_replace") or getattr(reference, "path", None) != "/":
        return None
    return reference


@functools.cache
def _template_client() -> Any:
    # Its own http client is never used (every copy gets the rollout's); one idle pool per process.
    return _new_client(
        {"base_url": "http://template.invalid/v1", "api_key": "EMPTY", "max_retries": 0},
        _own_async_http(),
    )


@functools.cache
def _flow_client_class() -> type:
    from openai import AsyncOpenAI

    from rllm.sdk.fast_chat import fast_chat_class

    class FlowAsyncOpenAI(AsyncOpenAI):
        """openai's AsyncOpenAI with a cheap idempotency key, and ``chat.completions.create`` in
        one hop where the gateway answers in process (``rllm.sdk.fast_chat``)."""

        @functools.cached_property
        def chat(self) -> Any:  # type: ignore[override]
            return fast_chat_class()(self)

        def _idempotency_key(self) -> str:
            # openai draws a uuid4 (os.urandom) per request for it; AsyncOpenAI never sends it
            # (no idempotency header) and the gateway would not read it: a counter step is
            # enough, still unique within the process.
            return response_id("rllm-idempotency")

    return FlowAsyncOpenAI


def in_process_handler(loop: asyncio.AbstractEventLoop, url: str) -> InProcessHandler | None:
    """The handler serving ``url``'s origin in process on ``loop`` (``serve_in_process``), if any."""
    return _IN_PROCESS.get((loop, _origin(url))) if _IN_PROCESS else None


def _served_loop(base_url: Any, origin: str | None = None) -> asyncio.AbstractEventLoop | None:
    """The running loop, if ``base_url``'s origin (``origin`` if given) is served in process on it."""
    if not _IN_PROCESS or not isinstance(base_url, str):
        return None
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    return loop if (loop, origin or _origin(base_url)) in _IN_PROCESS else None


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
            # (For the calls that still go over TCP: streams.) No cap on open connections, as
            # with a pool per rollout: a cap would queue requests in the client, not at the
            # model. Idle ones are kept 5 s (the gateway keeps them 75 s).
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
    origin = _origin(url)
    return serve_in(
        _IN_PROCESS, (asyncio.get_running_loop(), origin), handler, f"{origin} (on this event loop)"
    )


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
