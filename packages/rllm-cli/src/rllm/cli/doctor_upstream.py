"""The doctor's scripted upstream: a loopback OpenAI-compatible ``/v1/completions`` that answers
each call like vLLM, with the ids the tokenizer gives the scripted reply plus its end-of-turn
token, so every check of ``rllm doctor tokens`` exercises the template and the gateway, not a
model."""

from __future__ import annotations

import json
import socket
from typing import Any

import msgspec

from rllm.runtime.http_messages import Request, Response, StreamResponse
from rllm.runtime.http_router import Router
from rllm.runtime.http_server import HttpServer
from rllm.types.openai import Completion, CompletionChoice, error_body, response_id, usage

_enc = msgspec.json.Encoder().encode


class ScriptedUpstream:
    """A loopback OpenAI-compatible ``/v1/completions`` that answers the next scripted reply with
    the tokenizer's ids for it (+ the eos id), in vLLM's fields (``token_ids``, logprobs)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self.reply = ""
        self.eos = True  # False where the reply writes its own stop token (harmony's <|return|>)
        self.port = 0
        self._server: HttpServer | None = None
        self._router = Router()
        self._router.add("POST", "/v1/completions", self._completions)
        self._router.add("GET", "/v1/models", self._models)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def ids(self, text: str) -> list[int]:
        ids = list(self.tok.encode(text, add_special_tokens=False))
        if self.eos and self.tok.eos_token_id is not None:
            ids.append(int(self.tok.eos_token_id))
        return ids

    async def __aenter__(self) -> ScriptedUpstream:
        server = HttpServer(self._dispatch, _error, max_body_bytes=64 << 20)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sock.setblocking(False)
        self.port = sock.getsockname()[1]
        await server.start(sock)
        self._server = server
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            await self._server.stop(1.0)

    async def _dispatch(self, request: Request) -> Response | StreamResponse:
        return await self._router.dispatch(request, _error)

    async def _models(self, request: Request) -> Response:
        return Response(body=_enc({"object": "list", "data": [{"id": "doctor", "object": "model"}]}))

    async def _completions(self, request: Request) -> Response | StreamResponse:
        body = json.loads(request.body)
        prompt = list(body.get("prompt") or [])
        ids = self.ids(self.reply)
        choice = CompletionChoice(
            index=0, text=self.reply, finish_reason="stop", prompt_token_ids=prompt, token_ids=ids
        )
        if not body.get("stream"):
            out = Completion(
                id=response_id("cmpl"), model="doctor", choices=[choice], usage=usage(len(prompt), len(ids))
            )
            out.prompt_token_ids = prompt
            wire: dict[str, Any] = msgspec.to_builtins(out)
            images = (body.get("multi_modal_data") or {}).get("image")
            if images:  # as the local tinker sampler says it gave the model every image
                wire["images_used"] = len(images)
            return Response(body=_enc(wire))
        resp = StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        sent = ""
        for i, t in enumerate(ids):  # one token per chunk, as a sampler streams
            upto = self.tok.decode(ids[: i + 1], skip_special_tokens=True)
            text, sent = upto[len(sent) :], upto
            last = i == len(ids) - 1
            c = CompletionChoice(index=0, text=text, finish_reason="stop" if last else None, token_ids=[t])
            chunk = Completion(id="cmpl-doctor", model="doctor", choices=[c])
            if i == 0:
                chunk.prompt_token_ids = prompt
            if last:
                chunk.usage = usage(len(prompt), len(ids))
            await resp.write(b"data: " + _enc(chunk) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp


def _error(status: int, message: str) -> Response:
    return Response(status=status, body=_enc(error_body(status, message)))
