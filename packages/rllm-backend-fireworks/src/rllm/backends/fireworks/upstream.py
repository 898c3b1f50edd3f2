"""A loopback upstream in front of the Fireworks deployment, for the gateway.

The gateway captures token ids the way vLLM reports them (``prompt_token_ids``,
``choices[i].token_ids``) and sends no credential upstream. The deployment's OpenAI-compatible
endpoint needs ``Authorization: Bearer <FIREWORKS_API_KEY>`` and reports the exact token ids
only when asked with ``raw_output: true``, as ``choices[i].raw_output.completion_token_ids``
(and ``prompt_token_ids`` there or in the choice); with logprobs it reports the behaviour
policy's ``sampling_logprob`` beside the raw ``logprob``. This adapter adds the credential and
``raw_output``, pins full-distribution sampling (``top_p`` 1, ``top_k`` 0, unless the request
sets them: the serving stack's defaults would otherwise truncate the distribution the sampler
logprobs describe), and rewrites the answer into vLLM's fields, with ``logprob`` = the
sampling logprob. So the gateway's plain capture is token-true, and the API key never leaves
this process. ``/v1/models`` is answered locally (the gateway's health probe must not bill).
Streaming is refused with a 400 naming ``stream``.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import aiohttp
from aiohttp import web

from rllm.types.errors import StateError


def to_vllm_fields(resp: dict[str, Any], *, chat: bool, keep_raw: bool) -> dict[str, Any]:
    """Fireworks' ``raw_output`` and ``sampling_logprob`` -> vLLM's token-id and logprob fields."""
    for choice in resp.get("choices") or ():
        raw = choice.get("raw_output") if keep_raw else choice.pop("raw_output", None)
        raw = raw if isinstance(raw, dict) else {}
        if raw.get("completion_token_ids") is not None:
            choice["token_ids"] = [int(t) for t in raw["completion_token_ids"]]
        prompt_ids = choice.get("prompt_token_ids") or raw.get("prompt_token_ids")
        if prompt_ids is not None:
            if chat:
                resp.setdefault("prompt_token_ids", [int(t) for t in prompt_ids])
            else:
                choice["prompt_token_ids"] = [int(t) for t in prompt_ids]
        logprobs = choice.get("logprobs")
        content = logprobs.get("content") if isinstance(logprobs, dict) else None
        for entry in content or ():
            if isinstance(entry, dict) and entry.get("sampling_logprob") is not None:
                entry["logprob"] = entry["sampling_logprob"]
    return resp


class DeploymentUpstream:
    """An aiohttp server on 127.0.0.1 (its own thread and loop) proxying to the deployment."""

    def __init__(self, inference_url: str, api_key: str, model: str, timeout_s: float = 600.0) -> None:
        self.inference_url = inference_url.rstrip("/")
        self.model = model
        self._headers = {"Authorization": f"Bearer {api_key}"}
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.url = ""

    def start(self) -> str:
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            try:
                self._loop.run_until_complete(self._serve())
            except BaseException as exc:  # reported to start()'s caller
                failure.append(exc)
                ready.set()
                return
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="fireworks-upstream", daemon=True)
        self._thread.start()
        if not ready.wait(30) or failure:
            raise StateError(f"the Fireworks upstream adapter did not start: {failure}")
        return self.url

    async def _serve(self) -> None:
        self._session = aiohttp.ClientSession(timeout=self._timeout, headers=self._headers)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.add_routes(
            [
                web.get("/v1/models", self._models),
                web.post("/v1/completions", self._completions),
                web.post("/v1/chat/completions", self._chat),
            ]
        )
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}/v1"

    def stop(self) -> None:
        if self._loop is None:
            return

        async def shutdown() -> None:
            if self._runner is not None:
                await self._runner.cleanup()
            if self._session is not None:
                await self._session.close()

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(30)
        self._loop = None

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.model, "object": "model"}]})

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._forward(request, "completions", chat=False)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._forward(request, "chat/completions", chat=True)

    async def _forward(self, request: web.Request, path: str, *, chat: bool) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "the request body is not JSON", None)
        if not isinstance(body, dict):
            return _error(400, "the request body is not a JSON object", None)
        if body.get("stream"):
            return _error(
                400, "`stream` is not supported by the Fireworks upstream; send stream=false", "stream"
            )
        keep_raw = bool(body.get("raw_output"))
        body.pop("return_token_ids", None)  # vLLM's name; Fireworks answers raw_output
        body["raw_output"] = True
        body.setdefault("top_p", 1.0)
        body.setdefault("top_k", 0)
        assert self._session is not None
        try:
            async with self._session.post(f"{self.inference_url}/{path}", json=body) as resp:
                data = await resp.read()
                if resp.status != 200 or resp.content_type != "application/json":
                    return web.Response(body=data, status=resp.status, content_type=resp.content_type)
                answer = await resp.json()
        except (aiohttp.ClientError, TimeoutError) as exc:
            return _error(502, f"the Fireworks deployment did not answer: {exc!r}", None)
        return web.json_response(to_vllm_fields(answer, chat=chat, keep_raw=keep_raw))


def _error(status: int, message: str, param: str | None) -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": "invalid_request_error", "param": param}}, status=status
    )
