"""Serve any Python flow over the remote agent protocol (``rllm agent serve module:flow``).

The service side of :mod:`rllm.engine.rollout.agent_protocol`: ``POST /rollouts`` runs the flow once
against the request's ``config.base_url`` (the trainer's gateway session) under the request's
deadline and answers what it returned; a flow failure is answered 422 with the same
classification the engine gives a local flow (agent_error, infra_error, context_limit, timeout).
``GET /health`` reports the rollouts in flight. With ``capacity`` set, a request beyond it is
answered 503, which the engine treats as an infrastructure error and retries elsewhere. A client
that goes away (the engine's own deadline) cancels its rollout (async flows).
"""

from __future__ import annotations

import asyncio
import signal
import socket
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec

from rllm.engine.rollout.agent_protocol import (
    ErrorBody,
    Health,
    RolloutFailure,
    RolloutRequest,
    encode_result,
    from_wire,
)
from rllm.engine.rollout.failures import classify_exception
from rllm.engine.rollout.flow_runner import DeadlineExceeded, call_with_deadline
from rllm.runtime.http_messages import Request, Response
from rllm.runtime.http_router import Router
from rllm.runtime.http_server import HttpServer
from rllm.sdk.flow import RolloutFlow, as_flow
from rllm.types import Episode, TerminationReason, Trajectory

_MAX_BODY = 64 << 20


def _json(status: int, doc: Any) -> Response:
    return Response(status=status, body=msgspec.json.encode(doc))


def _failure(reason: TerminationReason, kind: str, message: str) -> Response:
    return _json(422, RolloutFailure(error=ErrorBody(type=kind, message=message), termination_reason=reason))


class AgentServer:
    """An HTTP server running ``flow`` for every ``POST /rollouts``."""

    def __init__(
        self, flow: Any, *, host: str = "127.0.0.1", port: int = 0, capacity: int | None = None
    ) -> None:
        self.flow: RolloutFlow = as_flow(flow)
        self.host, self.port, self.capacity = host, port, capacity
        self.active = 0
        self.served = 0
        self._server: HttpServer | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._router = Router()
        self._router.add("POST", "/rollouts", self._rollouts)
        self._router.add("GET", "/health", self._health)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> AgentServer:
        if not self.flow.is_async:
            self._executor = ThreadPoolExecutor(
                max_workers=self.capacity or 64, thread_name_prefix="rllm-agent"
            )
        server = HttpServer(
            self._dispatch,
            lambda status, msg: _json(status, {"error": {"type": "HTTP", "message": msg}}),
            max_body_bytes=_MAX_BODY,
        )
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        sock.setblocking(False)
        self.port = sock.getsockname()[1]
        await server.start(sock)
        self._server = server
        return self

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(1.0)
            self._server = None
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    async def __aenter__(self) -> AgentServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _dispatch(self, request: Request) -> Response:
        answer = await self._router.dispatch(
            request, lambda status, msg: _json(status, {"error": {"type": "HTTP", "message": msg}})
        )
        assert isinstance(answer, Response)
        return answer

    async def _health(self, request: Request) -> Response:
        return _json(200, Health(status="ok", active=self.active, capacity=self.capacity))

    async def _rollouts(self, request: Request) -> Response:
        try:
            job = msgspec.json.decode(request.body, type=RolloutRequest)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
            return _json(400, {"error": {"type": "InvalidRequest", "message": str(exc)}})
        if self.capacity is not None and self.active >= self.capacity:
            return _json(503, {"error": {"type": "Busy", "message": f"{self.active} rollouts in flight"}})
        config = from_wire(job.config)
        self.active += 1
        try:
            result = await call_with_deadline(
                self.flow.run,
                (job.task, config),
                is_async=self.flow.is_async,
                deadline_s=job.deadline_s,
                executor=self._executor,
            )
        except DeadlineExceeded as exc:
            return _failure(TerminationReason.TIMEOUT, "Timeout", f"rollout {exc}")
        except Exception as exc:
            return _failure(classify_exception(exc), type(exc).__name__, str(exc))
        finally:
            self.active -= 1
        if result is not None and not isinstance(result, str | dict | Trajectory | Episode):
            return _failure(
                TerminationReason.AGENT_ERROR,
                "FlowReturnError",
                f"a flow must return an Episode, Trajectory, dict, str or None; got {type(result).__name__}",
            )
        self.served += 1
        return Response(status=200, body=encode_result(result, job.task.id))


async def serve_forever(server: AgentServer, ready: Any = print) -> None:
    """Run ``server`` until SIGINT or SIGTERM; ``ready(line)`` is told its URL once it listens."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    ready(f"serving flow {server.flow.name!r} over the rLLM agent protocol at {server.url}")
    try:
        await stop.wait()
    finally:
        await server.stop()
