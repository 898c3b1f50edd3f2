"""Sending a call to the upstreams: sticky routing, failover, and the two HTTP clients.

Non-streaming calls to plain-http upstreams go through the lean keep-alive client
(``rllm.runtime.http_client``); streams, https upstreams and health checks use aiohttp. A
non-streaming call (with ``fast_http``, the default) to an upstream that lives in this process (the embedded local sampler,
``rllm.runtime.inprocess_upstreams``) is handed to it directly, with its decoded body: the same
routing, failover counters, answer handling and trace, without HTTP. Its aborts go to it directly.
Both ways of proxying a call (``rllm.gateway.proxy``'s task path and ``rllm.gateway.proxy_lane``)
send through the one ``UpstreamSender`` of their gateway.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
import msgspec

from rllm.gateway.calls import CallLedger, ProxyCall
from rllm.gateway.config import GatewayConfig
from rllm.gateway.errors import GatewayError
from rllm.gateway.sessions import Session
from rllm.gateway.upstreams import NoHealthyUpstream, Upstream, UpstreamPool
from rllm.runtime.http_client import FastHttpPool, UpstreamBadResponse, UpstreamConnectError, UpstreamDropped
from rllm.runtime.http_messages import Response
from rllm.runtime.inprocess_upstreams import InProcessUpstream, upstream_in_process

_json_encode = msgspec.json.Encoder().encode
_JSON = "application/json"
_T = TypeVar("_T")
_RETRYABLE = (
    aiohttp.ClientConnectorError,
    aiohttp.ServerDisconnectedError,
    aiohttp.ClientOSError,
    ConnectionResetError,
)


class UpstreamSender:
    """The upstream side of one gateway (see the module docstring). ``open()`` once the event
    loop runs, ``close()`` at the end."""

    def __init__(self, config: GatewayConfig, pool: UpstreamPool, ledger: CallLedger) -> None:
        self.config = config
        self.pool = pool
        self.ledger = ledger
        self.http: aiohttp.ClientSession | None = None
        self.fast: FastHttpPool | None = None

    async def open(self) -> None:
        """Create the upstream clients."""
        cfg = self.config
        self.http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                limit=0, limit_per_host=cfg.max_connections_per_upstream, ttl_dns_cache=None
            ),
            timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=cfg.connect_timeout_s, sock_read=cfg.upstream_timeout_s
            ),
            json_serialize=lambda o: _json_encode(o).decode(),
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
        )
        self.fast = FastHttpPool(
            connect_timeout_s=cfg.connect_timeout_s,
            read_timeout_s=cfg.upstream_timeout_s,
            max_body_bytes=cfg.max_upstream_body_bytes,
        )

    async def close(self) -> None:
        if self.http is not None:
            await self.http.close()
            self.http = None
        if self.fast is not None:
            self.fast.close()

    def plain_http(self) -> bool:
        """Every upstream speaks plain http (the lean client's only protocol)."""
        return not any(u.startswith("https:") for u in self.pool.upstreams)

    def route(self, session: Session, body: dict[str, Any], exclude: set[str] | None = None) -> Upstream:
        """The upstream for the session's next call (its sticky one if usable), made sticky, with
        the model name it serves put into ``body``. Raises NoHealthyUpstream."""
        w = self.pool.pick(session.upstream, exclude)
        session.upstream = w.url
        if self.config.policies:  # the call's policy named its model (rllm.gateway.policy_routes)
            return w
        # Agents often send a placeholder model name; the upstream serves what it serves.
        want = self.config.model_name
        if want is None and w.models and body.get("model") not in w.models:
            want = w.models[0]
        if want is not None:
            body["model"] = want
        return w

    async def send_whole(self, call: ProxyCall) -> tuple[int, bytes]:
        """Send a non-streaming call with failover: the upstream's status and whole answer. On
        failure the trace is finished (error, or abort when cancelled) and the error raised."""
        ledger = self.ledger
        try:
            if self.config.fast_http and self.plain_http():
                status, raw = await self._post_whole(call.session, call.path, call.body)
            else:
                w, resp = await self.post(call.session, call.path, call.body)
                w.inflight += 1
                try:
                    raw = await self._read_capped(resp)
                    status = resp.status
                finally:
                    w.inflight -= 1
                    resp.release()
        except GatewayError as exc:
            ledger.fail(call.trace, call.t0, exc.message)
            raise
        except TimeoutError:
            ledger.fail(call.trace, call.t0, "upstream timeout")
            raise GatewayError(504, "upstream timed out while answering", code="upstream_timeout") from None
        except UpstreamBadResponse as exc:
            why = f"upstream answered wrongly: {exc}"
            ledger.fail(call.trace, call.t0, why)
            raise GatewayError(502, why, code="upstream_error") from None
        except (aiohttp.ClientError, OSError) as exc:
            ledger.fail(call.trace, call.t0, f"upstream failed mid-response: {type(exc).__name__}: {exc}")
            raise GatewayError(
                502, f"upstream failed mid-response: {type(exc).__name__}", code="upstream_error"
            ) from None
        except asyncio.CancelledError:
            ledger.finish_trace(call.trace, None, "abort", call.t0)
            raise
        except Exception as exc:  # a bug: the call still leaves its one honest trace
            ledger.fail_unfinished(call.trace, call.t0, exc)
            raise
        return status, raw

    async def abort_upstreams(self) -> None:
        """Partial rollouts: tell every upstream to end its calls in flight now (``POST /abort``;
        each answers them with ``finish_reason = "abort"`` and the tokens so far). An upstream
        that cannot is a 502 naming it, so the pause fails loud instead of hanging."""
        assert self.http is not None
        http = self.http

        async def one(url: str) -> None:
            local = upstream_in_process(url)
            if local is not None:
                local.abort()
                return
            try:
                async with http.post(url + "/abort", data=b"{}", headers={"Content-Type": _JSON}) as resp:
                    if resp.status == 200:
                        return
                    why = f"POST {url}/abort answered {resp.status}"
            except (aiohttp.ClientError, OSError) as exc:
                why = f"POST {url}/abort failed: {type(exc).__name__}: {exc}"
            raise GatewayError(
                502,
                f"upstream cannot abort its calls in flight ({why}); partial rollouts need an "
                "upstream that can (the local tinker sampler's /v1/abort)",
                code="upstream_error",
            )

        await asyncio.gather(*(one(url) for url in self.pool.upstreams))

    async def list_models(self) -> Response:
        """``GET /v1/models`` of an upstream, as it answered."""
        assert self.http is not None
        try:
            w = self.pool.pick(None)
        except NoHealthyUpstream as exc:
            raise GatewayError(503, str(exc), code="no_healthy_upstream") from None
        try:
            async with self.http.get(f"{w.url}/models") as resp:
                body = await resp.read()
                return Response(status=resp.status, body=body, content_type=_JSON)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise GatewayError(
                502, f"upstream {w.url} failed: {type(exc).__name__}", code="upstream_error"
            ) from None

    # ------------------------------------------------------------------ sending with failover
    async def post(
        self, session: Session, path: str, body: dict[str, Any]
    ) -> tuple[Upstream, aiohttp.ClientResponse]:
        """POST through aiohttp (streaming, https upstreams), with failover."""
        assert self.http is not None
        http = self.http

        def send(w: Upstream) -> Awaitable[aiohttp.ClientResponse]:
            return http.post(w.url + path, data=_json_encode(body), headers={"Content-Type": _JSON})

        return await self._failover(session, body, send, _RETRYABLE, aiohttp.ClientConnectorError)

    async def _post_whole(self, session: Session, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
        """Non-streaming POST through the lean keep-alive client, with failover."""
        assert self.fast is not None
        fast = self.fast
        timeout_s = self.config.upstream_timeout_s

        def send(w: Upstream) -> Awaitable[tuple[int, bytes]]:
            local = upstream_in_process(w.url)
            if local is not None:
                return _post_in_process(local, path, body, timeout_s)
            return fast.post(w.url + path, _json_encode(body))

        _, answer = await self._failover(
            session, body, send, (UpstreamConnectError, UpstreamDropped, OSError), UpstreamConnectError
        )
        return answer

    async def _failover(
        self,
        session: Session,
        body: dict[str, Any],
        send: Callable[[Upstream], Awaitable[_T]],
        retryable: tuple[type[BaseException], ...],
        refused: type[BaseException],
    ) -> tuple[Upstream, _T]:
        """Send to the session's upstream; retry while nothing has been answered yet.

        A dropped kept-alive connection gets one more try on the same upstream (it may just have
        closed it); a refused connection, or a second drop, marks the upstream failed and moves
        on to another.
        """
        tried: set[str] = set()
        dropped_once: set[str] = set()
        last_err = ""
        for _ in range(self.config.retries + 2):
            try:
                w = self.route(session, body, tried or None)
            except NoHealthyUpstream as exc:
                msg = f"{exc}; last error: {last_err}" if last_err else str(exc)
                raise GatewayError(503, msg, code="no_healthy_upstream") from None
            w.inflight += 1
            w.requests += 1
            try:
                answer = await send(w)
                if not w.healthy:
                    self.pool.mark_answered(w)
                return w, answer
            except TimeoutError:  # before the retryable errors: TimeoutError is an OSError
                raise GatewayError(504, f"upstream {w.url} timed out", code="upstream_timeout") from None
            except retryable as exc:
                last_err = f"{w.url}: {type(exc).__name__}: {exc}"
                self.ledger.metrics.retries.inc()
                if not isinstance(exc, refused) and w.url not in dropped_once:
                    dropped_once.add(w.url)
                    continue
                self.pool.mark_failed(w, last_err)
                tried.add(w.url)
            finally:
                w.inflight -= 1
        raise GatewayError(
            502, f"all upstream attempts failed; last error: {last_err}", code="upstream_error"
        )

    async def _read_capped(self, resp: aiohttp.ClientResponse) -> bytes:
        """A whole answer through aiohttp, refused (UpstreamBadResponse) past max_upstream_body_bytes."""
        cap = self.config.max_upstream_body_bytes
        if resp.content_length is not None and resp.content_length > cap:
            raise UpstreamBadResponse(
                f"upstream answer of {resp.content_length} bytes exceeds the limit of {cap}"
            )
        parts: list[bytes] = []
        size = 0
        async for piece in resp.content.iter_any():
            size += len(piece)
            if size > cap:
                resp.close()
                raise UpstreamBadResponse(f"upstream answer of {size}+ bytes exceeds the limit of {cap}")
            parts.append(piece)
        return b"".join(parts)


async def _post_in_process(
    local: InProcessUpstream, path: str, body: dict[str, Any], timeout_s: float
) -> tuple[int, bytes]:
    """A whole call to an upstream in this process, with the HTTP client's read timeout."""
    async with asyncio.timeout(timeout_s):
        return await local.post_whole(path, body)


__all__ = ["UpstreamSender"]
