"""GatewayClient: a gateway's admin API over HTTP (a ``GatewayAdmin``), from any process.

Plain-http gateways are spoken to with the lean keep-alive client (``rllm.runtime.http_client``): an
engine makes two admin calls per rollout, and aiohttp's client costs more CPU per call (2.2x:
benchmarks/history/issue-14.md, "Figures moved out of code comments"). An https gateway goes through
aiohttp.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import msgspec

from rllm.gateway.admin_api import GatewayAPIError, SessionInfo, session_base_url
from rllm.gateway.trace_query import ALL_TRACES, TraceQuery
from rllm.runtime.http_client import FastHttpPool
from rllm.types import SamplingParams, TraceRecord, from_msgpack, to_builtins

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


class GatewayClient:
    """Async admin client over HTTP: ``async with GatewayClient(url, admin_key=...) as gw: ...``."""

    def __init__(self, url: str, admin_key: str | None = None, *, timeout_s: float = 600.0) -> None:
        self.url = url.rstrip("/")
        self.admin_key = admin_key
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._http: aiohttp.ClientSession | None = None
        self._fast: FastHttpPool | None = None
        if self.url.startswith("http://"):
            self._fast = FastHttpPool(connect_timeout_s=min(10.0, timeout_s), read_timeout_s=timeout_s)
        auth = f"Authorization: Bearer {admin_key}\r\n" if admin_key else ""
        self._heads = {
            accept: f"{auth}Accept: {accept}\r\n".encode("latin-1")
            for accept in ("application/json", "application/msgpack")
        }

    async def __aenter__(self) -> GatewayClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._fast is not None:
            self._fast.close()
        if self._http is not None:
            await self._http.close()
            self._http = None

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            headers = {"Authorization": f"Bearer {self.admin_key}"} if self.admin_key else {}
            self._http = aiohttp.ClientSession(headers=headers, timeout=self._timeout)
        return self._http

    async def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        accept: str = "application/json",
        answers: frozenset[int] = frozenset(),
    ) -> bytes:
        data = _encode(body) if body is not None else None
        if self._fast is not None:
            status, raw = await self._fast.request(
                method, self.url + path, data or b"", headers=self._heads[accept]
            )
        else:
            headers = {"Accept": accept}
            if data is not None:
                headers["Content-Type"] = "application/json"
            async with self._session().request(method, self.url + path, data=data, headers=headers) as resp:
                status, raw = resp.status, await resp.read()
        if status >= 400 and status not in answers:  # ``answers``: statuses whose body is the answer
            code = None
            try:
                error = _decode(raw)["error"]
                message = error["message"]
                code = error.get("code")
            except Exception:
                message = raw[:500].decode(errors="replace")
            raise GatewayAPIError(status, message, method, path, code if isinstance(code, str) else None)
        return raw

    async def _json(self, method: str, path: str, body: Any = None) -> Any:
        return _decode(await self._call(method, path, body))

    # ----------------------------------------------------------- sessions
    def session_url(self, session_id: str, role: str | None = None) -> str:
        """The OpenAI base URL an agent should use for this session (and role)."""
        return session_base_url(self.url, session_id, role)

    async def create_session(
        self,
        session_id: str | None = None,
        sampling: SamplingParams | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> SessionInfo:
        body: dict[str, Any] = {}
        if session_id is not None:
            body["session_id"] = session_id
        if sampling is not None:
            body["sampling"] = to_builtins(sampling)
        if metadata:
            body["metadata"] = metadata
        data = await self._json("POST", "/admin/sessions", body)
        return SessionInfo(data["session_id"], data["token"], data["base_url"])

    async def list_sessions(self) -> list[dict[str, Any]]:
        return (await self._json("GET", "/admin/sessions"))["sessions"]

    async def delete_session(self, session_id: str) -> int:
        """Delete a session and its traces; returns how many traces were freed."""
        return (await self._json("DELETE", f"/admin/sessions/{session_id}"))["traces"]

    async def finish_session(self, session_id: str) -> list[TraceRecord]:
        """Delete a session and return its traces ordered by ``seq``: one round trip where
        ``get_traces`` + ``delete_session`` take two (the end of every rollout)."""
        path = f"/admin/sessions/{session_id}/finish?format=msgpack"
        return from_msgpack(await self._call("POST", path, accept="application/msgpack"), list[TraceRecord])

    async def get_traces(self, session_id: str, role: str | None = None) -> list[TraceRecord]:
        """The session's traces ordered by ``seq`` (msgpack on the wire: packed token arrays)."""
        path = f"/admin/sessions/{session_id}/traces?format=msgpack"
        if role is not None:
            path += f"&role={role}"
        return from_msgpack(await self._call("GET", path, accept="application/msgpack"), list[TraceRecord])

    async def query_traces(self, query: TraceQuery = ALL_TRACES) -> list[TraceRecord]:
        params = {"format": "msgpack", **query.to_params()}
        path = "/admin/traces?" + "&".join(f"{k}={v}" for k, v in params.items())
        return from_msgpack(await self._call("GET", path), list[TraceRecord])

    async def flush(self) -> None:
        """Wait until every trace captured so far is committed to the store."""
        await self._json("POST", "/admin/flush")

    # ----------------------------------------------------------- weights & admission
    async def get_weight_version(self) -> int:
        return (await self._json("GET", "/admin/weight_version"))["weight_version"]

    async def set_weight_version(self, version: int) -> None:
        await self._json("PUT", "/admin/weight_version", {"weight_version": version})

    async def set_policy_models(self, models: dict[str, str]) -> None:
        await self._json("PUT", "/admin/policies", {"policies": models})

    async def pause(self, timeout_s: float = 600.0) -> None:
        """Stop admitting new requests (they wait) and return once in-flight ones have drained."""
        await self._json("POST", f"/admin/pause?timeout={timeout_s}")

    async def resume(self) -> None:
        await self._json("POST", "/admin/resume")

    # ----------------------------------------------------------- upstreams
    async def add_upstream(self, url: str) -> dict[str, Any]:
        return await self._json("POST", "/admin/upstreams", {"url": url})

    async def remove_upstream(self, url: str) -> None:
        await self._json("DELETE", "/admin/upstreams", {"url": url})

    async def list_upstreams(self) -> list[dict[str, Any]]:
        return (await self._json("GET", "/admin/upstreams"))["upstreams"]

    async def health(self) -> dict[str, Any]:
        # 503 is an answer here: a gateway with no healthy upstream says so in the body.
        return _decode(await self._call("GET", "/health", answers=frozenset({503})))
