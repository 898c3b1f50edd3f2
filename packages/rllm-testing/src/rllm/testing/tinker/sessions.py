"""Who calls the FAKE Tinker service (see :mod:`.server`): the credential check on every
request, the feature flags, the API key -> JWT exchange, sessions (created, kept alive,
finished) and telemetry. A mixin of FakeTinkerServer, whose state it uses."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from aiohttp import web

from rllm.testing.service import ContractError
from rllm.testing.tinker.contract import API, fake_jwt
from rllm.testing.tinker.training import RecordedRequest

# The paths the API key itself is good for: fetching the flags and exchanging it for a JWT.
_KEY_ONLY = (f"{API}/client/config", f"{API}/auth/token")


class FakeTinkerSessions:
    api_key: str
    client_config: dict[str, Any]
    requests: list[RecordedRequest]
    violations: list[str]
    sessions: dict[str, dict[str, Any]]
    _jwts: set[str]
    _ids: Iterator[int]

    @web.middleware
    async def _auth_and_record(self, request: web.Request, handler: Any) -> web.StreamResponse:
        key = request.headers.get("X-API-Key", "")
        if not self.client_config["pjwt_auth_enabled"]:
            ok = key == self.api_key
        else:
            ok = key == self.api_key if request.path in _KEY_ONLY else key in self._jwts
        if not ok:
            self.violations.append(f"{request.path}: bad credential")
            return web.json_response({"detail": "invalid credential"}, status=401)
        try:
            return await handler(request)
        except ContractError as exc:
            self.violations.append(f"{request.path}: {exc}")
            return web.json_response({"detail": str(exc)}, status=400)

    async def _json(self, request: web.Request) -> dict[str, Any]:
        """A request's JSON body, recorded in ``requests``."""
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else {}
        except json.JSONDecodeError as exc:
            raise ContractError(f"body is not JSON: {exc}") from exc
        self.requests.append(RecordedRequest(request.path, body))
        return body

    async def _client_config(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        if not body.get("sdk_version"):
            raise ContractError("client/config without sdk_version")
        return web.json_response(self.client_config)

    async def _auth_token(self, request: web.Request) -> web.Response:
        await self._json(request)
        jwt = fake_jwt("fake-user")
        self._jwts.add(jwt)
        return web.json_response({"jwt": jwt})

    async def _dynamic_config(self, request: web.Request) -> web.Response:
        await self._json(request)
        return web.json_response({"refresh_interval_sec": 300, "sample_cancel_enabled": False})

    async def _create_session(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        session_id = f"fake-session-{next(self._ids)}"
        self.sessions[session_id] = {"sdk_version": body.get("sdk_version"), "finished": None}
        return web.json_response({"type": "create_session", "session_id": session_id})

    async def _heartbeat(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        if body.get("session_id") not in self.sessions:
            raise ContractError(f"heartbeat for unknown session {body.get('session_id')!r}")
        return web.json_response({"type": "session_heartbeat"})

    async def _finish_session(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        session = self.sessions.get(request.match_info["session_id"])
        if session is None:
            raise ContractError(f"finish of unknown session {request.match_info['session_id']!r}")
        if body.get("reason", {}).get("type") not in ("success", "errored", "interrupted"):
            raise ContractError(f"finish reason {body.get('reason')!r}")
        session["finished"] = body["reason"]["type"]
        return web.json_response({})

    async def _telemetry(self, request: web.Request) -> web.Response:
        await self._json(request)
        return web.json_response({"status": "accepted"})
