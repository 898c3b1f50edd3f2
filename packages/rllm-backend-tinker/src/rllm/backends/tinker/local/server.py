"""SamplerServer: an aiohttp OpenAI-compatible server on loopback in front of a SamplerEngine.

It runs on its own thread and event loop, so a busy caller loop (the Trainer's) never stalls
inference, and blocking torch work stays on the engine's worker thread.

With ``in_process`` (``sampler_in_process``) it also registers itself as an in-process upstream (``rllm.runtime.inprocess_upstreams``): a
gateway in the same process (the engine's embedded one, next to the embedded local backend)
hands it whole calls directly (``post_whole``), on the gateway's own loop, instead of POSTing
them through an HTTP client, loopback TCP and this server's thread. The same checks build the
same answer, serialised as the HTTP route serialises it, so the gateway's trace is the same;
streams still come over HTTP.

Reading a request (checks, chat template, images, tokens) is :mod:`.calls`'s; this module serves
the routes and builds the answers.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Callable
from typing import Any

import msgspec
from aiohttp import web

from rllm.backends.tinker.local.calls import Call, CallReader
from rllm.backends.tinker.local.generation import SamplerBusy, SamplerEngine
from rllm.backends.tinker.local.protocol import RequestError, chat_response, completion_response
from rllm.backends.tinker.local.streaming import send_stream, stream_chunks
from rllm.runtime.background import BackgroundLoop
from rllm.runtime.inprocess_upstreams import serve_upstream
from rllm.types.errors import StateError
from rllm.types.openai import error_body

log = logging.getLogger(__name__)
# What aiohttp answers for a handler's unexpected exception (its text/plain form), so a gateway
# calling in process records the same upstream failure as over HTTP.
_INTERNAL_ERROR = b"500 Internal Server Error\n\nServer got itself in trouble"


class SamplerServer:
    """Serves ``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``, ``/health`` and
    ``POST /v1/abort`` (every request in flight ends now with ``finish_reason = "abort"`` and its
    tokens so far: the gateway's partial rollouts abort at a weight sync and continue later).

    A client that disconnects cancels its handler (``handler_cancellation``), and with it its
    request in the engine: decoding it stops at the next step and its rows are freed. A request
    the engine's full queue refuses (``SamplerBusy``) is answered 503 with the reason."""

    def __init__(
        self,
        engine: SamplerEngine,
        model_name: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        default_max_tokens: int = 256,
        image_processor: Any = None,
        in_process: bool = False,
        policy_engines: dict[str, SamplerEngine] | None = None,
    ) -> None:
        self.engine = engine
        # Several policies (local/policies.py): a request naming a policy as its ``model`` is
        # sampled by that policy's engine; any other name by ``engine``, as with one policy.
        self.policy_engines = dict(policy_engines or {})
        self.in_process = in_process
        self.calls = CallReader(engine, default_max_tokens, image_processor)  # requests checked
        self.model_name = model_name
        self.host = host
        self.port = port
        self._background = BackgroundLoop("rllm-sampler-http")
        self._token_texts: dict[int, str] = {}  # decoded tokens of prompt_logprobs answers
        self._runner: web.AppRunner | None = None
        self._unserve: Callable[[], None] | None = None
        self.url = ""

    @property
    def image_processor(self) -> Any:
        """A vision-language model's image processor (None: images are refused with a 400)."""
        return self.calls.image_processor

    @property
    def default_max_tokens(self) -> int:
        return self.calls.default_max_tokens

    # lifecycle -------------------------------------------------------------------------------
    def start(self) -> str:
        """Start the server thread; returns the base URL (ending in /v1) once it is listening."""
        try:
            self._background.start(self._serve, self._cleanup)
        except Exception as exc:
            raise StateError(f"sampler server failed to start on {self.host}:{self.port}: {exc}") from exc
        if self.in_process:
            self._unserve = serve_upstream(self.url, self)
        return self.url

    async def _serve(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/abort", self._abort)
        # A client gone is a request nobody will read: cancel its handler, and so its decoding.
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://{self.host}:{port}/v1"

    async def _cleanup(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def stop(self) -> None:
        if self._unserve is not None:
            self._unserve()
            self._unserve = None
        self._background.stop()

    # in process (rllm.runtime.inprocess_upstreams) --------------------------------------------
    async def post_whole(self, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
        """A whole call from a proxy in this process, on its event loop: the status and body the
        HTTP route would send (``path`` below ``/v1``). Streams go over HTTP."""
        if body.get("stream"):
            raise StateError("post_whole answers whole calls; a stream goes over HTTP")
        try:
            if path == "/chat/completions":
                try:
                    call = await self.calls.chat(body)
                except RequestError as exc:
                    return 400, _dumps(exc.body())
                answer = await self._chat_answer(call, body)
            elif path == "/completions":
                try:
                    call = await self.calls.completions(body)
                except RequestError as exc:
                    return 400, _dumps(exc.body())
                answer = await self._completions_answer(body, call)
            else:
                return 404, b"404: Not Found"
        except SamplerBusy as exc:
            return 503, _dumps(_busy_body(exc))
        except Exception:
            log.exception("internal error on %s (in process)", path)
            return 500, _INTERNAL_ERROR
        return 200, _dumps(answer)

    def abort(self) -> None:
        """``POST /v1/abort`` in process."""
        self._abort_all()

    def _abort_all(self) -> None:
        self.engine.abort_all()
        for engine in self.policy_engines.values():
            engine.abort_all()

    def _engine_for(self, body: dict[str, Any]) -> tuple[SamplerEngine, str]:
        """The engine a request's ``model`` names, and the name its answer carries."""
        model = body.get("model")
        if isinstance(model, str) and model in self.policy_engines:
            return self.policy_engines[model], model
        return self.engine, self.model_name

    # handlers --------------------------------------------------------------------------------
    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "weight_version": self.engine.weight_version})

    async def _abort(self, request: web.Request) -> web.Response:
        self._abort_all()
        return web.json_response({"aborted": True, "weight_version": self.engine.weight_version})

    async def _models(self, request: web.Request) -> web.Response:
        card = {
            "id": self.model_name,
            "object": "model",
            "created": 0,
            "owned_by": "rllm",
            "max_model_len": self.engine.max_positions,
        }
        cards = [card] + [{**card, "id": name} for name in self.policy_engines]
        return web.json_response({"object": "list", "data": cards})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await _json_body(request)
            call = await self.calls.chat(body)
        except RequestError as exc:
            return web.json_response(exc.body(), status=400)
        try:
            answer = await self._chat_answer(call, body)
        except SamplerBusy as exc:
            return web.json_response(_busy_body(exc), status=503)
        if body.get("stream"):
            return await send_stream(request, stream_chunks(answer, chat=True, usage=call.usage))
        return web.json_response(answer)

    async def _chat_answer(self, call: Call, body: dict[str, Any]) -> dict[str, Any]:
        engine, name = self._engine_for(body)
        seqs = await engine.submit_async(call.gens[0])
        return chat_response(
            name,
            call.prompts[0],
            seqs,
            self._decode_token,
            logprobs=call.logprobs,
            return_token_ids=call.return_token_ids,
            tool_calls=self.calls.tool_calls if call.tools else None,
        )

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await _json_body(request)
            call = await self.calls.completions(body)
        except RequestError as exc:
            return web.json_response(exc.body(), status=400)
        try:
            answer = await self._completions_answer(body, call)
        except SamplerBusy as exc:
            return web.json_response(_busy_body(exc), status=503)
        if body.get("stream"):
            return await send_stream(request, stream_chunks(answer, chat=False, usage=call.usage))
        return web.json_response(answer)

    async def _completions_answer(self, body: dict[str, Any], call: Call) -> dict[str, Any]:
        prompts, logprobs = call.prompts, call.logprobs
        engine, name = self._engine_for(body)
        results = await asyncio.gather(*(engine.submit_async(g) for g in call.gens))
        # All prompts in one batched pass (a distillation step sends its sequences together).
        prompt_scores: list[list[Any]] | None = None
        if call.prompt_logprobs == 0:
            prompt_scores = await asyncio.to_thread(engine.prompt_logprobs_batch, prompts)
        elif call.prompt_logprobs is not None:  # top k: a distillation teacher's dense loss
            prompt_scores = await asyncio.to_thread(engine.prompt_topk_batch, prompts, call.prompt_logprobs)
        answer = completion_response(
            name,
            prompts,
            list(results),
            self._decode_token,
            logprobs=logprobs,
            return_token_ids=call.return_token_ids,
        )
        if prompt_scores is not None:
            # vLLM's shape: per prompt token, None for the first, else {token_id: {logprob, rank, decoded_token}}.
            per_prompt = max(1, len(answer["choices"]) // len(prompts))  # choices run prompt by prompt
            for choice in answer["choices"]:
                ids = prompts[choice["index"] // per_prompt]
                scores = prompt_scores[choice["index"] // per_prompt]
                choice["prompt_logprobs"] = [
                    self._prompt_entry(t, lp) for t, lp in zip(ids, scores, strict=True)
                ]
        if body.get("multi_modal_data") is not None:
            # Says the model saw the images: a caller sending them (the gateway's cumulative
            # mode) refuses an answer without this, from a server that ignored them.
            answer["images_used"] = len(body["multi_modal_data"]["image"])
        return answer

    def _prompt_entry(self, token: int, scored: float | dict[int, tuple[float, int]] | None) -> Any:
        """One position of vLLM's ``prompt_logprobs``: None (the first), or ``{token_id: {logprob,
        rank, decoded_token}}`` for the token alone (k = 0, rank unknown) or the top k and it."""
        if scored is None:
            return None
        if not isinstance(scored, dict):
            return {str(token): {"logprob": scored, "rank": None, "decoded_token": self._token_text(token)}}
        return {
            str(t): {"logprob": lp, "rank": rank, "decoded_token": self._token_text(t)}
            for t, (lp, rank) in scored.items()
        }

    def _token_text(self, token: int) -> str:
        """``_decode_token``, remembered: a top-k answer decodes tens of thousands of entries a
        distillation step (k + 1 per position of 128 sequences), mostly the same few tokens."""
        text = self._token_texts.get(token)
        if text is None:
            text = self._token_texts[token] = self._decode_token(token)
        return text

    # helpers ---------------------------------------------------------------------------------
    @functools.lru_cache(maxsize=65536)  # noqa: B019 - the server lives as long as its tokenizer
    def _decode_token(self, token_id: int) -> str:
        return self.engine.decode([token_id])


def _busy_body(exc: SamplerBusy) -> dict[str, Any]:
    """OpenAI's error shape for a request the full queue refused."""
    return msgspec.to_builtins(error_body(503, str(exc), code="sampler_full"))


def _dumps(data: Any) -> bytes:
    """JSON as ``web.json_response`` writes it (json.dumps), so both paths send the same bytes."""
    return json.dumps(data).encode()


async def _json_body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    return body
