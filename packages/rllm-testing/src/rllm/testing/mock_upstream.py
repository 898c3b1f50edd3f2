"""MockUpstream: a real loopback OpenAI-compatible server that answers like vLLM.

Tests, engine tests and benchmarks need an inference server that returns token ids and
logprobs without a model. This one speaks HTTP on 127.0.0.1, answers
``/v1/chat/completions``, ``/v1/completions`` and ``/v1/models`` in vLLM's response format,
streams SSE, and is deterministic: the same request always gets the same tokens.

It runs on the gateway's own lean server (:mod:`rllm.runtime.http_server`), not aiohttp's: in
throughput benchmarks the mock shares the machine with the gateway and the engine, and every
microsecond it spends per request is CPU taken from what is being measured.

Token ids: without a tokenizer, a text's ids are its UTF-8 bytes (a byte-level "tokenizer",
so ``len(ids)`` is predictable); with ``tokenizer=`` (a transformers tokenizer), prompts are
rendered with its chat template and the completion is sampled character by character, which
is a valid but non-canonical tokenization, just as a real sampler produces.

The reply comes from ``responder(request_dict)``: it may return a string, a
:class:`MockReply` (text and/or tool calls), or ``None`` for the default echo reply.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec

from rllm.runtime.background import BackgroundLoop
from rllm.runtime.http_messages import Request, Response, StreamResponse
from rllm.runtime.http_router import Router
from rllm.runtime.http_server import HttpServer

_json_encode = msgspec.json.Encoder().encode
_json_decode = msgspec.json.Decoder().decode
_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
_MAX_BODY_BYTES = 1 << 30
_ASK = object()  # "ask the responder" (it was not asked yet)

# Response ids look like uuid4 hex (32 hex digits) but cost a counter step, not an os.urandom
# call: a random per-process prefix keeps ids from two mock processes apart.
_ID_PREFIX = os.urandom(10).hex()
_id_counter = itertools.count()


def _next_id(kind: str) -> str:
    return f"{kind}-{_ID_PREFIX}{next(_id_counter) & 0xFFFFFFFFFFFF:012x}"


@dataclass
class MockReply:
    """A scripted assistant turn: text, tool calls (OpenAI dicts or (name, arguments) pairs)."""

    text: str = ""
    tool_calls: list[dict[str, Any]] | None = None
    finish_reason: str | None = None


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


Responder = Callable[[dict[str, Any]], "str | MockReply | Awaitable[str | MockReply | None] | None"]


@dataclass
class MockStats:
    requests: int = 0
    by_path: dict[str, int] = field(default_factory=dict)
    last_request: dict[str, Any] | None = None
    cancelled: int = 0


def _logprob_of(token_id: int) -> float:
    # Deterministic, strictly negative and varied, so tests can check them exactly.
    return -((token_id % 13) + 1) / 16.0


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
        self.tokenizer = tokenizer
        self.host = host
        self.port = port
        self.max_model_len = max_model_len
        self.models_latency = 0.0
        self.failure: MockFailure | None = None
        self.stats = MockStats()
        self._server: HttpServer | None = None
        self._background = BackgroundLoop("mock-upstream")
        self._eos_id: int | None = None
        # Per token id, the chat logprob entry already encoded as JSON: a benchmark's upstream
        # should spend its CPU on HTTP, not on rebuilding and re-encoding the same entries.
        self._lp_cache: dict[int, bytes] = {}
        self._router = Router()
        self._router.add("POST", "/v1/chat/completions", self._chat)
        self._router.add("POST", "/v1/completions", self._completions)
        self._router.add("GET", "/v1/models", self._models)
        self._router.add("GET", "/health", self._health)
        if tokenizer is not None:
            self._eos_id = tokenizer.eos_token_id

    # ---------------------------------------------------------------- lifecycle
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
        self.failure = MockFailure(mode=mode, status=status, count=count)

    def clear_failure(self) -> None:
        self.failure = None

    # ---------------------------------------------------------------- tokens
    def encode_text(self, text: str) -> list[int]:
        """Sampler-style ids for ``text``: per character with a tokenizer, else UTF-8 bytes."""
        if self.tokenizer is None:
            return list(text.encode())
        ids: list[int] = []
        for ch in text:
            tid = self.tokenizer.convert_tokens_to_ids(self._byte_level(ch))
            if tid is None or tid == self.tokenizer.unk_token_id:
                ids.extend(self.tokenizer.encode(ch, add_special_tokens=False))
            else:
                ids.append(tid)
        return ids

    def _byte_level(self, ch: str) -> str:
        # The tokenizer's own pre-tokenizer maps a character to its vocabulary symbol(s).
        pre = self.tokenizer.backend_tokenizer.pre_tokenizer
        if pre is None:
            return ch
        pieces = pre.pre_tokenize_str(ch)
        return "".join(p for p, _ in pieces) if pieces else ch

    def token_text(self, token_id: int) -> str:
        if self.tokenizer is None:
            return bytes([token_id]).decode("latin-1") if token_id < 256 else f"<{token_id}>"
        return self.tokenizer.decode([token_id])

    def decode(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return bytes(i for i in ids if i < 256).decode(errors="replace")
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def render_chat(self, messages: list[dict[str, Any]], tools: Any = None) -> list[int]:
        if self.tokenizer is None:
            parts = []
            for m in messages:
                content = m.get("content")
                parts.append(f"<{m.get('role')}>{content if type(content) is str else _text_of(content)}\n")
            parts.append("<assistant>")
            return list("".join(parts).encode())
        text = self.tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=False
        )
        return self.tokenizer.encode(text, add_special_tokens=False)

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
        gen = self._generate(self._as_reply(raw, body), body)
        answer = self._chat_body if chat else self._completion_body
        out = Response(body=_json_encode(answer(body, prompt(), gen)))
        if not self.latency:
            return out
        return asyncio.get_running_loop().call_later(self.latency, request.respond, out)

    async def _reply_for(self, body: dict[str, Any], raw: Any = _ASK) -> MockReply:
        """The responder's reply (``raw`` if it was already asked), awaited and normalised."""
        if raw is _ASK:
            raw = self.responder(body) if self.responder is not None else None
        if inspect.isawaitable(raw):
            raw = await raw
        return self._as_reply(raw, body)

    @staticmethod
    def _as_reply(raw: Any, body: dict[str, Any]) -> MockReply:
        if raw is None:
            return MockReply(text=_default_text(body))
        return MockReply(text=raw) if isinstance(raw, str) else raw

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
        return body, lambda: self.render_chat(messages, body.get("tools")), True

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
            prompt_ids = self.encode_text(prompt) if self.tokenizer is None else self.tokenizer.encode(prompt)
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
        gen = self._generate(reply, body)
        if body.get("stream"):
            return await self._stream(request, body, prompt_ids, gen, chat=chat)
        answer = self._chat_body if chat else self._completion_body
        return Response(body=_json_encode(answer(body, prompt_ids, gen)))

    def _generate(self, reply: MockReply, body: dict[str, Any]) -> _Generation:
        text = reply.text
        tool_calls = _normalise_tool_calls(reply.tool_calls) if reply.tool_calls else []
        sampled_text = text
        if tool_calls:
            # The model "emits" the calls as text; the server parses them out, as vLLM does.
            sampled_text = text + "".join(
                f"<tool_call>{tc['function']['name']}:{tc['function']['arguments']}</tool_call>"
                for tc in tool_calls
            )
        ids = self.encode_text(sampled_text)
        finish = reply.finish_reason or ("tool_calls" if tool_calls else "stop")
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
        if isinstance(max_tokens, int) and max_tokens > 0 and len(ids) > max_tokens:
            ids = ids[:max_tokens]
            finish = "length"
            tool_calls = []
            text = self.decode(ids)
        elif self._eos_id is not None:
            ids = [*ids, self._eos_id]
        return _Generation(text=text, ids=ids, finish_reason=finish, tool_calls=tool_calls)

    def _chat_body(self, body: dict[str, Any], prompt_ids: list[int], gen: _Generation) -> dict[str, Any]:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": gen.text or None,
            "refusal": None,
            "tool_calls": gen.tool_calls,
        }
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": gen.finish_reason,
            "stop_reason": None,
        }
        if body.get("logprobs"):
            choice["logprobs"] = {"content": self._chat_logprobs(gen.ids)}
        n_prompt, n_gen = len(prompt_ids), len(gen.ids)
        out: dict[str, Any] = {
            "id": _next_id("chatcmpl"),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or self.model,
            "choices": [choice],
            "usage": {
                "prompt_tokens": n_prompt,
                "completion_tokens": n_gen,
                "total_tokens": n_prompt + n_gen,
            },
            "prompt_logprobs": None,
        }
        if body.get("return_token_ids"):
            out["prompt_token_ids"] = prompt_ids
            choice["token_ids"] = gen.ids
        return out

    def _completion_body(
        self, body: dict[str, Any], prompt_ids: list[int], gen: _Generation
    ) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": 0,
            "text": gen.text,
            "logprobs": None,
            "finish_reason": gen.finish_reason if gen.finish_reason != "tool_calls" else "stop",
            "stop_reason": None,
        }
        if body.get("logprobs") is not None and body.get("logprobs") is not False:
            choice["logprobs"] = self._completion_logprobs(gen.ids)
        out: dict[str, Any] = {
            "id": _next_id("cmpl"),
            "object": "text_completion",
            "created": int(time.time()),
            "model": body.get("model") or self.model,
            "choices": [choice],
            "usage": _usage(prompt_ids, gen.ids),
        }
        if body.get("return_token_ids"):
            choice["prompt_token_ids"] = prompt_ids
            choice["token_ids"] = gen.ids
            out["prompt_token_ids"] = prompt_ids
        return out

    def _chat_logprobs(self, ids: list[int]) -> msgspec.Raw:
        """The chat ``logprobs.content`` list of ``ids``, as JSON spliced from cached entries."""
        cache = self._lp_cache
        try:
            entries = [cache[t] for t in ids]
        except KeyError:
            entries = [self._chat_logprob_entry(t) for t in ids]
        return msgspec.Raw(b"[" + b",".join(entries) + b"]")

    def _chat_logprob_entry(self, token_id: int) -> bytes:
        """One token's chat logprob entry (token, logprob, bytes, top_logprobs), encoded once."""
        entry = self._lp_cache.get(token_id)
        if entry is None:
            tok = self.token_text(token_id)
            entry = self._lp_cache[token_id] = _json_encode(
                {
                    "token": tok,
                    "logprob": _logprob_of(token_id),
                    "bytes": list(tok.encode()),
                    "top_logprobs": [],
                }
            )
        return entry

    def _completion_logprobs(self, ids: list[int]) -> dict[str, Any]:
        tokens = [self.token_text(t) for t in ids]
        offsets, pos = [], 0
        for t in tokens:
            offsets.append(pos)
            pos += len(t)
        return {
            "tokens": tokens,
            "token_logprobs": [_logprob_of(t) for t in ids],
            "top_logprobs": [{tok: _logprob_of(t)} for tok, t in zip(tokens, ids, strict=True)],
            "text_offset": offsets,
        }

    async def _stream(
        self,
        request: Request,
        body: dict[str, Any],
        prompt_ids: list[int],
        gen: _Generation,
        *,
        chat: bool,
    ) -> StreamResponse:
        resp = StreamResponse(headers=_SSE_HEADERS)
        await resp.prepare(request)
        rid = _next_id("chatcmpl" if chat else "cmpl")
        created = int(time.time())
        model = body.get("model") or self.model
        want_ids = bool(body.get("return_token_ids"))
        want_lp = bool(body.get("logprobs"))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        die_mid = self.failure is not None and self.failure.mode == "die_mid_stream"

        async def send(obj: dict[str, Any]) -> None:
            await resp.write(b"data: " + _json_encode(obj) + b"\n\n")

        obj_name = "chat.completion.chunk" if chat else "text_completion"
        try:
            if chat:
                first: dict[str, Any] = {
                    "id": rid,
                    "object": obj_name,
                    "created": created,
                    "model": model,
                    "choices": [
                        {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None}
                    ],
                }
                if want_ids:
                    first["prompt_token_ids"] = prompt_ids
                await send(first)
            # One chunk per token; the text of a chunk is the decoded piece.
            pieces = _split_text(gen.text, len(gen.ids))
            for i, tid in enumerate(gen.ids):
                if die_mid and i == len(gen.ids) // 2:
                    request.abort()
                    return resp
                if self.chunk_delay:
                    await asyncio.sleep(self.chunk_delay)
                piece = pieces[i]
                choice: dict[str, Any] = {"index": 0, "finish_reason": None}
                if chat:
                    choice["delta"] = {"content": piece}
                    choice["logprobs"] = {"content": self._chat_logprobs([tid])} if want_lp else None
                else:
                    choice["text"] = piece
                    choice["logprobs"] = self._completion_logprobs([tid]) if want_lp else None
                if want_ids:
                    choice["token_ids"] = [tid]
                chunk = {
                    "id": rid,
                    "object": obj_name,
                    "created": created,
                    "model": model,
                    "choices": [choice],
                }
                if not chat and want_ids and i == 0:
                    chunk["prompt_token_ids"] = prompt_ids
                    choice["prompt_token_ids"] = prompt_ids
                await send(chunk)
            if gen.tool_calls and chat:
                deltas = [{"index": j, **tc} for j, tc in enumerate(gen.tool_calls)]
                await send(
                    {
                        "id": rid,
                        "object": obj_name,
                        "created": created,
                        "model": model,
                        "choices": [{"index": 0, "delta": {"tool_calls": deltas}, "finish_reason": None}],
                    }
                )
            last: dict[str, Any] = {"index": 0, "finish_reason": gen.finish_reason}
            if chat:
                last["delta"] = {}
            else:
                last["text"] = ""
            await send({"id": rid, "object": obj_name, "created": created, "model": model, "choices": [last]})
            if include_usage:
                await send(
                    {
                        "id": rid,
                        "object": obj_name,
                        "created": created,
                        "model": model,
                        "choices": [],
                        "usage": _usage(prompt_ids, gen.ids),
                    }
                )
            await resp.write(b"data: [DONE]\n\n")  # the server ends the chunked body on return
        except (ConnectionResetError, asyncio.CancelledError):
            self.stats.cancelled += 1
            raise
        return resp


@dataclass
class _Generation:
    text: str
    ids: list[int]
    finish_reason: str
    tool_calls: list[dict[str, Any]]


def _split_text(text: str, n: int) -> list[str]:
    """Split ``text`` into ``n`` consecutive pieces (some may be empty) whose join is ``text``."""
    if n <= 0:
        return []
    base, extra = divmod(len(text), n)
    out, pos = [], 0
    for i in range(n):
        size = base + (1 if i < extra else 0)
        out.append(text[pos : pos + size])
        pos += size
    return out


def _normalise_tool_calls(calls: list[Any] | None) -> list[dict[str, Any]]:
    out = []
    for i, c in enumerate(calls or []):
        if isinstance(c, tuple):
            name, args = c
            c = {
                "function": {
                    "name": name,
                    "arguments": args if isinstance(args, str) else _json_encode(args).decode(),
                }
            }
        c = dict(c)
        c.setdefault("id", f"call_{i}_{uuid.uuid4().hex[:8]}")
        c.setdefault("type", "function")
        out.append(c)
    return out


def _text_of(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict))
    return str(content)


def _default_text(body: dict[str, Any]) -> str:
    messages = body.get("messages")
    if isinstance(messages, list) and messages:
        last = messages[-1]
        return f"echo: {_text_of(last.get('content') if isinstance(last, dict) else last)}"
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return f"echo: {prompt[-32:]}"
    return f"echo: {len(prompt) if isinstance(prompt, list) else 0} tokens"


def _usage(prompt_ids: list[int], ids: list[int]) -> dict[str, int]:
    return {
        "prompt_tokens": len(prompt_ids),
        "completion_tokens": len(ids),
        "total_tokens": len(prompt_ids) + len(ids),
    }


def _error(status: int, message: str, *, param: str | None = None) -> Response:
    body = {
        "error": {
            "message": message,
            "type": "invalid_request_error" if status < 500 else "server_error",
            "param": param,
            "code": status,
        }
    }
    return Response(status=status, body=_json_encode(body))


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
