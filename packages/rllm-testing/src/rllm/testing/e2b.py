"""FAKE E2B service for contract tests: a loopback HTTP server speaking the E2B SDK's wire protocol.

Built from the SDK's own wire types: the control plane parses ``NewSandbox`` and answers with
``Sandbox`` (``e2b.api.client.models``); envd's process service decodes ``StartRequest`` and
streams ``StartResponse`` events (``e2b.envd.process.process_pb``) in Connect's envelope framing;
files go through envd's ``/files`` route. Each fake "microVM" is a real local sandbox that the
caller's ``new_sandbox()`` makes (the engine's bubblewrap sandbox in rLLM's tests), so commands
the SDK sends run isolated, never on the host. Needs the ``e2b`` SDK and aiohttp.
"""

from __future__ import annotations

import gzip
import itertools
import json
import posixpath
import shlex
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from e2b.api.client.models import NewSandbox
from e2b.api.client.models import Sandbox as SandboxModel
from e2b.envd.process.process_pb import ProcessEvent, StartRequest, StartResponse
from protobuf import Oneof

ENVD_VERSION = "0.5.7"  # octet-stream uploads, commands with stdin


def envelope(payload: bytes, flags: int = 0) -> bytes:
    return bytes([flags]) + len(payload).to_bytes(4, "big") + payload


class FakeE2B:
    """One server for both the API (``api_url``) and envd (``sandbox_url``); envd requests are
    routed by the SDK's ``E2b-Sandbox-Id`` header.

    ``new_sandbox()`` makes the sandbox behind one fake microVM, with workdir ``/work``: an object
    with the engine sandbox's ``exec`` / ``read_file`` / ``write_file`` / ``close`` / ``closed``.
    """

    def __init__(self, new_sandbox: Callable[[], Awaitable[Any]]) -> None:
        self.new_sandbox = new_sandbox
        self.boxes: dict[str, Any] = {}
        self.created: list[NewSandbox] = []
        self.killed: list[str] = []
        self._ids = itertools.count()
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def __aenter__(self) -> FakeE2B:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v2/sandboxes", self.create)
        app.router.add_delete("/sandboxes/{sandbox_id}", self.kill)
        app.router.add_get("/health", self.health)
        app.router.add_post("/process.Process/Start", self.start)
        app.router.add_get("/files", self.read)
        app.router.add_post("/files", self.write)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for box in self.boxes.values():
            await box.close()
        if self._runner is not None:
            await self._runner.cleanup()

    def _box(self, request: web.Request) -> Any:
        box = self.boxes.get(request.headers.get("E2b-Sandbox-Id", ""))
        if box is None or box.closed:
            raise web.HTTPBadGateway(text="sandbox not found")
        return box

    async def create(self, request: web.Request) -> web.Response:
        body = NewSandbox.from_dict(await request.json())
        self.created.append(body)
        sandbox_id = f"fake{next(self._ids)}"
        self.boxes[sandbox_id] = await self.new_sandbox()
        model = SandboxModel(
            template_id=body.template_id, sandbox_id=sandbox_id, client_id="fake", envd_version=ENVD_VERSION
        )
        return web.json_response(model.to_dict(), status=201)

    async def kill(self, request: web.Request) -> web.Response:
        sandbox_id = request.match_info["sandbox_id"]
        box = self.boxes.get(sandbox_id)
        if box is None:
            return web.json_response({"code": 404, "message": "not found"}, status=404)
        await box.close()
        self.killed.append(sandbox_id)
        return web.Response(status=204)

    async def health(self, request: web.Request) -> web.Response:
        self._box(request)
        return web.Response(status=204)

    async def start(self, request: web.Request) -> web.StreamResponse:
        box = self._box(request)
        raw = await request.read()
        payload = raw[5 : 5 + int.from_bytes(raw[1:5], "big")]
        if raw[0] & 0x01:  # a compressed envelope (connect-content-encoding, gzip)
            payload = gzip.decompress(payload)
        # The SDK picks the codec (Connect's proto or JSON); answer in the same one.
        as_json = request.content_type == "application/connect+json"
        start = StartRequest.from_json(payload.decode()) if as_json else StartRequest.from_binary(payload)
        process = start.process
        if process is None:
            return web.Response(status=400, text="StartRequest without a process")
        timeout_ms = int(request.headers.get("connect-timeout-ms", "60000"))
        response = web.StreamResponse(headers={"Content-Type": request.content_type})
        await response.prepare(request)

        async def send(event: Any) -> None:
            message = StartResponse(event=ProcessEvent(event=event))
            await response.write(envelope(message.to_json().encode() if as_json else message.to_binary()))

        await send(Oneof("start", ProcessEvent.StartEvent(pid=1)))
        cwd = process.cwd or "/work"
        line = f"cd {shlex.quote(cwd)} && exec {shlex.join([process.cmd, *process.args])}"
        # Connect deadlines are the server's to enforce: past connect-timeout-ms the stream
        # ends with deadline_exceeded, as envd does.
        result = await box.exec(line, timeout=timeout_ms / 1000, env=dict(process.envs))
        if result.timed_out:
            error = {"error": {"code": "deadline_exceeded", "message": "the command ran past its deadline"}}
            await response.write(envelope(json.dumps(error).encode(), flags=0x02))
            await response.write_eof()
            return response
        if result.stdout:
            out = ProcessEvent.DataEvent(output=Oneof("stdout", result.stdout.encode()))
            await send(Oneof("data", out))
        if result.stderr:
            err = ProcessEvent.DataEvent(output=Oneof("stderr", result.stderr.encode()))
            await send(Oneof("data", err))
        end = ProcessEvent.EndEvent(
            exit_code=result.exit_code, exited=True, status=f"exit status {result.exit_code}"
        )
        await send(Oneof("end", end))
        await response.write(envelope(b"{}", flags=0x02))
        await response.write_eof()
        return response

    async def read(self, request: web.Request) -> web.Response:
        box = self._box(request)
        try:
            data = await box.read_file(request.query["path"])
        except Exception as exc:
            return web.json_response({"code": 404, "message": str(exc)}, status=404)
        return web.Response(body=data, content_type="application/octet-stream")

    async def write(self, request: web.Request) -> web.Response:
        box = self._box(request)
        files: list[tuple[str, bytes]] = []
        if request.content_type.startswith("multipart/"):
            reader = await request.multipart()
            while (part := await reader.next()) is not None:
                files.append((request.query.get("path") or part.filename or "", await part.read()))  # type: ignore[union-attr]
        else:
            files.append((request.query["path"], await request.read()))
        for path, data in files:
            await box.write_file(path, data)
        return web.json_response(
            [{"name": posixpath.basename(p), "type": "file", "path": p} for p, _ in files]
        )


def created_summary(body: NewSandbox) -> dict[str, Any]:
    """The create request as the service received it (wire field names)."""
    return json.loads(json.dumps(body.to_dict()))
