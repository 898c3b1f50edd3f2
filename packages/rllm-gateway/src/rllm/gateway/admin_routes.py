"""The admin API over HTTP (``/admin/...``), the session's own trace route, ``/health`` and
``/metrics``: each route decodes its request, checks the admin key and calls the server's
admin operation (the one ``LocalGatewayClient`` calls directly)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from rllm.gateway.auth import bearer, require_admin, same_secret, session_denied
from rllm.gateway.errors import GatewayError
from rllm.gateway.store import encodable
from rllm.gateway.trace_query import TraceQuery
from rllm.runtime.http_messages import Handler, Request, Response
from rllm.types import SamplingParams, SchemaError, TraceRecord, convert, to_json, to_msgpack
from rllm.types.errors import InputError

if TYPE_CHECKING:
    from rllm.gateway.ports import GatewayOps

_json_encode = msgspec.json.Encoder().encode
_JSON = "application/json"
_MSGPACK = "application/msgpack"


def _json(data: Any) -> Response:
    return Response(body=_json_encode(data), content_type=_JSON)


def records_response(request: Request, records: list[TraceRecord]) -> Response:
    """Traces as JSON, or msgpack with ``?format=msgpack`` / ``Accept: application/msgpack``."""
    fmt = request.query.get("format")
    as_msgpack = fmt == "msgpack" or (fmt is None and _MSGPACK in request.headers.get("Accept", ""))
    encode, ctype = (to_msgpack, _MSGPACK) if as_msgpack else (to_json, _JSON)
    try:
        body = encode(records)
    except (OverflowError, RecursionError, TypeError, ValueError):
        body = encode(encodable(records))  # the store can always be read
    return Response(body=body, content_type=ctype)


class AdminRoutes:
    """The HTTP handlers of ``server``'s admin API; ``routes()`` lists them for its router."""

    def __init__(self, server: GatewayOps) -> None:
        self.server = server

    def routes(self) -> list[tuple[str, str, Handler]]:
        return [
            ("GET", "/sessions/{sid}/traces", self.session_traces),
            ("GET", "/health", self.health),
            ("GET", "/metrics", self.metrics),
            ("POST", "/admin/sessions", self.create_session),
            ("GET", "/admin/sessions", self.list_sessions),
            ("GET", "/admin/sessions/{sid}", self.get_session),
            ("DELETE", "/admin/sessions/{sid}", self.delete_session),
            ("POST", "/admin/sessions/{sid}/finish", self.finish_session),
            ("GET", "/admin/sessions/{sid}/traces", self.session_traces),
            ("GET", "/admin/traces", self.query_traces),
            ("POST", "/admin/flush", self.flush),
            ("GET", "/admin/upstreams", self.list_upstreams),
            ("POST", "/admin/upstreams", self.add_upstream),
            ("DELETE", "/admin/upstreams", self.remove_upstream),
            *((method, "/admin/workers", self.renamed_workers) for method in ("GET", "POST", "DELETE")),
            ("GET", "/admin/weight_version", self.get_weight_version),
            ("PUT", "/admin/weight_version", self.set_weight_version),
            ("POST", "/admin/weight_version", self.set_weight_version),
            ("PUT", "/admin/policies", self.set_policy_models),
            ("POST", "/admin/pause", self.pause),
            ("POST", "/admin/resume", self.resume),
        ]

    def _admin(self, request: Request) -> None:
        require_admin(request, self.server.config.admin_key)

    def _body(self, request: Request) -> dict[str, Any]:
        if not request.can_read_body:
            return {}
        return self.server.validator.decode(request.body, whole=True)

    # ----------------------------------------------------------- open routes
    async def health(self, request: Request) -> Response:
        """200 when model calls can reach something; 503 (the same body, with its ``reason``)
        when no upstream is healthy, so a load balancer's probe sees it too."""
        info = self.server.health_info()
        response = _json(info)
        if info["status"] != "ok":
            response.status = 503
        return response

    async def metrics(self, request: Request) -> Response:
        body, ctype = self.server.metrics.render()
        return Response(body=body, headers={"Content-Type": ctype})

    async def session_traces(self, request: Request) -> Response:
        server = self.server
        sid = request.match_info["sid"]
        if request.path.startswith("/admin/"):
            self._admin(request)
        else:
            # An agent may read its own session with its token; the admin may read any.
            s = server.sessions.get(sid)
            presented = bearer(request)
            guarded = server.config.session_auth or server.config.admin_key is not None
            if guarded and not same_secret(presented, server.config.admin_key):  # noqa: SIM102
                if s is None or presented is None or not s.token_matches(presented):
                    raise session_denied(sid)
        role = request.query.get("role")
        records = await server.store.get(sid)
        if role is not None:
            records = [r for r in records if r.role == role]
        return records_response(request, records)

    # ----------------------------------------------------------- sessions and traces
    async def create_session(self, request: Request) -> Response:
        self._admin(request)
        body = self._body(request)
        sampling = None
        if body.get("sampling") is not None:
            try:
                sampling = convert(body["sampling"], SamplingParams)
            except SchemaError as exc:
                raise GatewayError(
                    400, f"invalid sampling: {exc.reason}", param=f"sampling.{exc.path}"
                ) from None
        s = self.server.open_session(body.get("session_id"), sampling, body.get("metadata") or {})
        return _json(s.info(self.server.url, with_token=True))

    async def list_sessions(self, request: Request) -> Response:
        self._admin(request)
        url = self.server.url
        return _json({"sessions": [s.info(url, with_token=False) for s in self.server.sessions.values()]})

    async def get_session(self, request: Request) -> Response:
        self._admin(request)
        s = self.server.session_registry.existing(request.match_info["sid"])
        return _json(s.info(self.server.url, with_token=False))

    async def delete_session(self, request: Request) -> Response:
        self._admin(request)
        sid = request.match_info["sid"]
        n = await self.server.close_session(sid)
        return _json({"deleted": sid, "traces": n})

    async def finish_session(self, request: Request) -> Response:
        self._admin(request)
        return records_response(request, await self.server.finish_session(request.match_info["sid"]))

    async def query_traces(self, request: Request) -> Response:
        self._admin(request)
        try:
            query = TraceQuery.from_params(request.query)
        except InputError as exc:
            raise GatewayError(400, str(exc)) from None
        records = await self.server.store.query(query)
        return records_response(request, records)

    async def flush(self, request: Request) -> Response:
        self._admin(request)
        store = self.server.store
        await store.flush()
        return _json({"flushed": True, "traces": store.trace_count()})

    # ----------------------------------------------------------- upstreams
    async def list_upstreams(self, request: Request) -> Response:
        self._admin(request)
        return _json({"upstreams": [w.info() for w in self.server.pool.upstreams.values()]})

    def _upstream_url(self, request: Request) -> str:
        body = self._body(request)
        url = body.get("url") or request.query.get("url")
        if not isinstance(url, str) or not url:
            raise GatewayError(400, "'url' (an upstream base URL ending in /v1) is required", param="url")
        return url

    async def add_upstream(self, request: Request) -> Response:
        self._admin(request)
        w = await self.server.add_upstream(self._upstream_url(request))
        return _json(w.info())

    async def remove_upstream(self, request: Request) -> Response:
        self._admin(request)
        return _json({"removed": self.server.remove_upstream(self._upstream_url(request))})

    async def renamed_workers(self, request: Request) -> Response:
        """The old path of the upstreams API: a 404 naming the new one, not a bare "not found"."""
        raise GatewayError(404, "/admin/workers was renamed to /admin/upstreams", code="renamed")

    # ----------------------------------------------------------- weights and admission
    async def get_weight_version(self, request: Request) -> Response:
        self._admin(request)
        return _json({"weight_version": self.server.weight_version})

    async def set_weight_version(self, request: Request) -> Response:
        self._admin(request)
        v = self._body(request).get("weight_version")
        self.server.set_weight_version(v)  # type: ignore[arg-type] - validated there
        return _json({"weight_version": v})

    async def set_policy_models(self, request: Request) -> Response:
        self._admin(request)
        models = self._body(request).get("policies")
        self.server.set_policy_models(models)  # type: ignore[arg-type] - validated there
        return _json({"policies": models})

    async def pause(self, request: Request) -> Response:
        """Stop admitting requests (they wait) and return once in-flight ones have finished."""
        self._admin(request)
        try:
            timeout = float(request.query.get("timeout", "600"))
        except ValueError:
            raise GatewayError(400, "'timeout' must be a number of seconds", param="timeout") from None
        await self.server.pause(timeout)
        return _json({"paused": True, "inflight": self.server.inflight})

    async def resume(self, request: Request) -> Response:
        self._admin(request)
        self.server.resume()
        return _json({"paused": False})


__all__ = ["AdminRoutes", "records_response"]
