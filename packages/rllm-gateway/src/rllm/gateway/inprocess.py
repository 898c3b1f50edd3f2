"""Proxy calls from flows that run on the gateway's own event loop, answered without TCP.

When the engine runs its flows as tasks in its own process (``rollout.executor: local``) next to
its embedded gateway, every LLM call would otherwise go flow -> openai -> httpx -> loopback TCP
-> the gateway's HTTP parser, all on the same loop and CPU. :func:`answer` takes the call as the
gateway's own :class:`~rllm.runtime.http_messages.Request` (method, path, headers, body) and runs
it through the same routing, session and token checks, validation, proxying and trace recording
as a call that came over TCP (the task path of the server); only the socket and the HTTP framing
are skipped. The engine hands it to :func:`rllm.sdk.clients.serve_in_process` for the gateway's
URL, so the flows' openai clients reach it in memory.

A call it does not take returns None and goes over TCP as before: a streamed one (its chunks are
written to the connection), one over the body size limit (the HTTP server answers 413), or one
made on another event loop (a thread's own loop, a sync flow).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from rllm.runtime.http_messages import Headers, Request, Response

if TYPE_CHECKING:
    from rllm.gateway.server import GatewayServer


async def answer(
    server: GatewayServer, method: str, path: str, raw_query: str, headers: dict[str, str], body: bytes
) -> tuple[int, dict[str, str], bytes] | None:
    """The gateway's answer to one call (status, headers, body), or None: send it over TCP.

    ``headers`` come lower-cased (``rllm.sdk.clients.InProcessHandler``'s contract) and are the
    request's own from here on (not copied)."""
    if (
        server.serving_loop is not asyncio.get_running_loop()
        or b'"stream"' in body  # a stream may be asked for: only TCP carries its chunks
        or len(body) > server.config.max_body_bytes
    ):
        return None
    resp = await server.answer(Request(None, method, path, raw_query, Headers(headers), body))
    if not isinstance(resp, Response):  # a stream the body did not say it wanted: none today
        return None
    out = {"content-type": resp.content_type}
    if resp.headers:
        out.update(resp.headers)
    return resp.status, out, resp.body
