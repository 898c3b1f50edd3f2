"""Upstream inference servers living in this process, reachable without their HTTP server.

The embedded local sampler (rllm-backend-tinker) runs in the trainer's process, next to the
engine's embedded gateway; every call the gateway forwards to it would otherwise cross an HTTP
client, loopback TCP, an aiohttp server and a second event loop's thread, all on the same CPUs.
A server that can answer a whole (non-streaming) call directly registers itself here under its
base URL (:func:`serve_upstream`); a proxy that finds its upstream's URL here
(:func:`upstream_in_process`) hands it the decoded request body instead of POSTing it.

This module sits below both: the gateway never imports a backend, a backend never imports the
gateway. The registry is per process and keyed by URL only, so a gateway in another process
(a flow worker, a Ray actor) finds nothing here and keeps using HTTP. Registering follows
``rllm.types.in_process``, the rule the sdk's table of in-process servers shares.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from rllm.types.in_process import serve_in


class InProcessUpstream(Protocol):
    """What a server registered here answers, on the caller's event loop."""

    async def post_whole(self, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
        """A non-streaming POST to ``path`` (below the base URL, e.g. ``/chat/completions``):
        the status and the answer's bytes, exactly as its HTTP route would send them. ``body``
        is the caller's decoded JSON object; the server only reads it."""
        ...

    def abort(self) -> None:
        """``POST {url}/abort``: end every call in flight now (each answers with what it has)."""
        ...


# base URL (no trailing slash) -> the server answering it in process.
_SERVED: dict[str, InProcessUpstream] = {}


def serve_upstream(url: str, server: InProcessUpstream) -> Callable[[], None]:
    """Answer proxies' calls to ``url`` with ``server`` in process; returns the function that
    ends it (call it before the server stops)."""
    key = url.rstrip("/")
    return serve_in(_SERVED, key, server, key)


def upstream_in_process(url: str) -> InProcessUpstream | None:
    """The server answering ``url`` in this process, or None (then use HTTP)."""
    return _SERVED.get(url.rstrip("/")) if _SERVED else None


__all__ = ["InProcessUpstream", "serve_upstream", "upstream_in_process"]
