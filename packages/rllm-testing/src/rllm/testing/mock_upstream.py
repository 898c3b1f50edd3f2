"""MockUpstream: a real loopback OpenAI-compatible server that answers like vLLM.

Tests, engine tests and benchmarks need an inference server that returns token ids and
logprobs without a model. This one speaks HTTP on 127.0.0.1, answers
``/v1/chat/completions``, ``/v1/completions`` and ``/v1/models`` in vLLM's response format,
streams SSE, and is deterministic: the same request always gets the same tokens.

It runs on rLLM's own lean server (:mod:`rllm.runtime.http_server`), not aiohttp's: in
throughput benchmarks the mock shares the machine with the gateway and the engine, and every
microsecond it spends per request is CPU taken from what is being measured.

Token ids (:mod:`rllm.testing.mock_tokens`): without a tokenizer, a text's ids are its UTF-8
bytes; with ``tokenizer=`` (a transformers tokenizer), prompts are rendered with its chat
template and the completion is tokenized character by character.

The reply comes from ``responder(request_dict)``: it may return a string, a
:class:`MockReply` (text and/or tool calls), or ``None`` for the default echo reply
(:mod:`rllm.testing.mock_replies`). Streams are in :mod:`rllm.testing.mock_stream`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import socket
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec

from rllm.runtime.background import BackgroundLoop
from rllm.runtime.http_messages import Request, Response, StreamResponse
from rllm.runtime.http_router import Router
from rllm.runtime.http_server import HttpServer
from rllm.testing.mock_replies import (
    MockReply,
    Responder,
    as_reply,
    chat_body,
    completion_body,
    generate,
)
from rllm.testing.mock_stream import StreamPlan, stream_reply
from rllm.testing.mock_tokens import MockTokens
from rllm.types.openai import error_body

_json_encode = msgspec.json.Encoder().encode
_json_decode = msgspec.json.Decoder().decode
_MAX_BODY_BYTES = 1 << 30
_ASK = object()  # "ask the responder" (it was not asked yet)
FAILURE_MODES = ("status", "hang", "die", "die_mid_stream")


@dataclass
class MockFailure:
    """Failure injection: the next ``count`` requests (or all when count is None) fail.

    ``mode`` is ``"status"`` (answer ``status`` with an OpenAI error), ``"hang"`` (never
    answer), ``"die"`` (close the connection without an answer) or ``"die_mid_stream"``
    (send half of a streamed reply, then close the connection).
    """

    mode: str = "status"
    status: int = 500
    count: int | None = None


@dataclass
class MockStats:
    requests: int = 0
    by_path: dict[str, int] = field(default_factory=dict)
    last_request: dict[str, Any] | None = None
    cancelled: int = 0


class MockUpstream:
    """A loopback vLLM look-alike. ``await start()`` / ``url`` (ends in ``/v1``) / ``await stop()``.

    ``latency`` (seconds) delays each answer (before the first byte); ``chunk_delay`` spaces
    streamed chunks. ``model`` is the name served at /v1/models; ``models_latency`` delays that
    route alone (a server busy enough to answer health probes slowly while it still serves).
    """

    def __init__(
        self,
        *,
        model: str = "mock-model",
        latency: float = 0.0,
        chunk_delay: float = 0.0,
        responder: Responder | None = None,
        tokenizer: Any = None,
        host: str = "127.0.0.1",
        port: int = 0,
        max_model_len: int = 1 << 20,
    ) -> None:
        self.model = model
        self.latency = latency
        self.chunk_delay = chunk_delay
        self.responder = responder
        self.tokens = MockTokens(tokenizer)
        self.host = host
        self.port = port
        self.max_model_len = max_model_len
        self.models_latency = 0.0
        self.failure: MockFailure | None = None
        self.stats = MockStats()
        self._server: HttpServer | None = None
        self._background = BackgroundLoop("mock-upstream")
        self._router = Router()
        self._router.add("POST", "/v1/chat/completions", self._chat)
        self._router.add("POST", "/v1/completions", self._completions)
        self._router.add("GET", "/v1/models", self._models)
        self._router.add("GET", "/health", self._health)

    # ---------------------------------------------------------------- lifecycle
    @property
    def tokenizer(self) -> Any:
        """The transformers tokenizer the token ids come from (None: UTF-8 bytes)."""
        return self.tokens.tokenizer

    @property
    def url(self) -> str:
        """Base URL ending in /v1, as an OpenAI client wants it."""
        return f"http://{self.host}:{self.port}/v1"

    async def start(self) -> MockUpstream:
        server = HttpServer(
            self._dispatch,
            lambda status, msg: _error(status, msg),
            max_body_bytes=_MAX_BODY_BYTES,
            early=self._early,
        )
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        sock.setblocking(False)
        self.port = sock.getsockname()[1]
        await server.start(sock, backlog=4096)
        self._server = server
        return self

    async def stop(self) -> None:
        if self._server is not None:
            # In-flight requests get a second to finish (a hung one is cancelled after it).
            await self._server.stop(1.0)
            self._server = None

    async def __aenter__(self) -> MockUpstream:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def start_in_thread(self) -> MockUpstream:
        """Run on a private event loop in a daemon thread (for sync callers)."""
        self._background.start(self.start, self.stop)
        return self

    def stop_in_thread(self) -> None:
        self._background.stop(timeout=10)

    def fail(self, mode: str = "status", status: int = 500, count: int | None = None) -> None:
        """Inject failures; see :class:`MockFailure`. ``clear_failure()`` undoes it."""
        if mode not in FAILURE_MODES:
            raise ValueError(f"MockUpstream.fail: mode must be one of {FAILURE_MODES}, got {mode!r}")
        if not 100 <= status <= 599:
            raise ValueError(f"MockUpstream.fail: status must be an HTTP status (100-599), got {status!r}")
        self.failure = MockFailure(mode=mode, status=status, count=count)

    def clear_failure(self) -> None:
        self.failure = None

    # ---------------------------------------------------------------- tokens
    def encode_text(self, text: str) -> list[int]:
        """Sampler-style ids for ``text`` (see :class:`MockTokens`)."""
        return self.tokens.encode_text(text)

    def decode(self, ids: list[int]) -> str:
        return self.tokens.decode(ids)

    # ---------------------------------------------------------------- handlers
    async def _dispatch(self, request: Request) -> Response | StreamResponse:
        return await self._router.dispatch(request, _error)

    async def _health(self, request: Request) -> Response:
        return Response(body=b"ok", content_type="text/plain; charset=utf-8")

    async def _models(self, request: Request) -> Response:
        self._count(request.path, None)
        if self.models_latency:
            await asyncio.sleep(self.models_latency)
        body = {
            "object": "list",
            "data": [
                {
                    "id": self.model,
                    "object": "model",
                    "created": 0,
                    "owned_by": "rllm-mock",
                    "max_model_len": self.max_model_len,
                }
            ],
        }
        return Response(body=_json_encode(body))

    def _count(self, path: str, body: dict[str, Any] | None) -> None:
        stats = self.stats
        stats.requests += 1
        stats.by_path[path] = stats.by_path.get(path, 0) + 1
        if body is not None:
            stats.last_request = body

    def _read(self, request: Request) -> dict[str, Any] | Response:
        try:
            body = _json_decode(request.body)
        except msgspec.DecodeError as exc:
            return _error(400, f"malformed JSON: {exc}")
        if not isinstance(body, dict):
            return _error(400, "request body must be a JSON object")
        self._count(request.path, body)
        return body

    async def _maybe_fail(self, request: Request) -> Response | None:
        f = self.failure
        if f is None:
            return None
        if f.count is not None:
            if f.count <= 0:
                self.failure = None
                return None
            f.count -= 1
        if f.mode == "status":
            return _error(f.status, "injected failure")
        if f.mode == "hang":
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                self.stats.cancelled += 1
                raise
        if f.mode == "die":
            request.abort()
            return Response(status=500)  # never sent: the connection is gone
        return None

    def _early(self, request: Request) -> Response | Awaitable[Response | StreamResponse] | Any | None:
        """Whole answers without an injected failure skip the handler task: built at once and
        written from the latency timer's own callback (returned as the pending handle, which the
        server cancels if the client goes away). A stand-in for vLLM should add as little as it
        can to what a benchmark times. The responder is asked on arrival here, not after the
        latency; streams and awaitable replies go on in a task."""
        if request.method != "POST" or self.failure is not None:
            return None
        if request.path == "/v1/chat/completions":
            call = self._chat_call(request)
        elif request.path == "/v1/completions":
            call = self._completion_call(request)
        else:
            return None
        if isinstance(call, Response):
            return call
        body, prompt, chat = call
        raw = self.responder(body) if self.responder is not None else None
        if body.get("stream") or inspect.isawaitable(raw):
            return self._answer(request, body, prompt, chat=chat, raw_reply=raw)
        gen = generate(self.tokens, as_reply(raw, body), body)
        answer = chat_body if chat else completion_body
        out = Response(body=_json_encode(answer(self.tokens, body, self.model, prompt(), gen)))
        if not self.latency:
            return out
        return asyncio.get_running_loop().call_later(self.latency, request.respond, out)

    async def _reply_for(self, body: dict[str, Any], raw: Any = _ASK) -> MockReply:
        """The responder's reply (``raw`` if it was already asked), awaited and normalised."""
        if raw is _ASK:
            raw = self.responder(body) if self.responder is not None else None
        if inspect.isawaitable(raw):
            raw = await raw
        return as_reply(raw, body)

    async def _chat(self, request: Request) -> Response | StreamResponse:
        call = self._chat_call(request)
        if isinstance(call, Response):
            return call
        body, prompt, chat = call
        return await self._answer(request, body, prompt, chat=chat)

    def _chat_call(self, request: Request) -> tuple[dict[str, Any], Callable[[], list[int]], bool] | Response:
        """The request body, its prompt's ids (rendered when asked) and chat=True, or an error."""
        body = self._read(request)
        if isinstance(body, Response):
            return body
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return _error(400, "messages must be a non-empty list", param="messages")
        return body, lambda: self.tokens.render_chat(messages, body.get("tools")), True

    async def _completions(self, request: Request) -> Response | StreamResponse:
        call = self._completion_call(request)
        if isinstance(call, Response):
            return call
        body, prompt, chat = call
        return await self._answer(request, body, prompt, chat=chat)

    def _completion_call(
        self, request: Request
    ) -> tuple[dict[str, Any], Callable[[], list[int]], bool] | Response:
        body = self._read(request)
        if isinstance(body, Response):
            return body
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            prompt_ids = self.tokens.encode_prompt(prompt)
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            prompt_ids = prompt
        elif isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
            prompt_ids = prompt[0]
        else:
            return _error(400, "prompt must be a string or a non-empty list of token ids", param="prompt")
        return body, lambda: prompt_ids, False

    async def _answer(
        self,
        request: Request,
        body: dict[str, Any],
        prompt: Callable[[], list[int]],
        *,
        chat: bool,
        raw_reply: Any = _ASK,
    ) -> Response | StreamResponse:
        """What both routes do once the request is valid: injected failure, latency, the reply,
        then a stream or a whole body. ``prompt`` gives the prompt's ids (rendered only now)."""
        if self.failure is not None:
            failed = await self._maybe_fail(request)
            if failed is not None:
                return failed
        if self.latency:
            await asyncio.sleep(self.latency)
        reply = await self._reply_for(body, raw_reply)
        prompt_ids = prompt()
        gen = generate(self.tokens, reply, body)
        if body.get("stream"):
            plan = StreamPlan(
                body=body,
                model=self.model,
                prompt_ids=prompt_ids,
                gen=gen,
                chat=chat,
                chunk_delay=self.chunk_delay,
                die_mid_stream=self.failure is not None and self.failure.mode == "die_mid_stream",
            )
            try:
                return await stream_reply(request, self.tokens, plan)
            except (ConnectionResetError, asyncio.CancelledError):
                self.stats.cancelled += 1
                raise
        answer = chat_body if chat else completion_body
        return Response(body=_json_encode(answer(self.tokens, body, self.model, prompt_ids, gen)))


def _error(status: int, message: str, *, param: str | None = None) -> Response:
    return Response(status=status, body=_json_encode(error_body(status, message, param=param)))


@contextlib.contextmanager
def mock_upstream_in_thread(**kwargs: Any) -> Iterator[MockUpstream]:
    """``with mock_upstream_in_thread() as mock:`` for sync tests and scripts."""
    mock = MockUpstream(**kwargs).start_in_thread()
    try:
        yield mock
    finally:
        mock.stop_in_thread()


__all__ = [
    "MockFailure",
    "MockReply",
    "MockStats",
    "MockUpstream",
    "Responder",
    "mock_upstream_in_thread",
]
