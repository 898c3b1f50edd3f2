"""SamplerServer: an aiohttp OpenAI-compatible server on loopback in front of a SamplerEngine.

It runs on its own thread and event loop, so a busy caller loop (the Trainer's) never stalls
inference, and blocking torch work stays on the engine's worker thread.

With ``in_process`` (``sampler_in_process``) it also registers itself as an in-process upstream (``rllm.runtime.inprocess_upstreams``): a
gateway in the same process (the engine's embedded one, next to the embedded local backend)
hands it whole calls directly (``post_whole``), on the gateway's own loop, instead of POSTing
them through an HTTP client, loopback TCP and this server's thread. The same checks build the
same answer, serialised as the HTTP route serialises it, so the gateway's trace is the same;
streams still come over HTTP.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import web

from rllm.backends.tinker.local.generation import GenerationRequest, SamplerEngine
from rllm.backends.tinker.local.prompt_cache import PromptCache, prompt_key
from rllm.backends.tinker.local.protocol import (
    MAX_TOP_LOGPROBS,
    RequestError,
    chat_response,
    completion_response,
    parse_messages,
    parse_prompts,
    parse_sampling,
)
from rllm.backends.tinker.local.streaming import include_usage, send_stream, stream_chunks
from rllm.runtime.background import BackgroundLoop
from rllm.runtime.inprocess_upstreams import serve_upstream
from rllm.types.errors import StateError

log = logging.getLogger(__name__)
# What aiohttp answers for a handler's unexpected exception (its text/plain form), so a gateway
# calling in process records the same upstream failure as over HTTP.
_INTERNAL_ERROR = b"500 Internal Server Error\n\nServer got itself in trouble"


@dataclass(slots=True)
class _Call:
    """A checked request, ready to generate: one prompt (chat) or several (completions)."""

    prompts: list[list[int]]
    gens: list[GenerationRequest]
    usage: bool
    logprobs: Any  # chat: whether to return them; completions: how many top ones (or None)
    return_token_ids: bool
    prompt_logprobs: int | None = None  # vLLM's: None (off), 0 (the tokens' own), k (and the top k)


class SamplerServer:
    """Serves ``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``, ``/health`` and
    ``POST /v1/abort`` (every request in flight ends now with ``finish_reason = "abort"`` and its
    tokens so far: the gateway's partial rollouts abort at a weight sync and continue later)."""

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
    ) -> None:
        self.engine = engine
        self.in_process = in_process
        # With an image processor (a vision-language model) chat messages may hold data-URI
        # image blocks (vlm_prompt.render_vlm_prompt), and a token-id completions prompt may come
        # with its images (``multi_modal_data``, as the gateway's cumulative mode sends it);
        # without one they are refused with a 400.
        self.image_processor = image_processor
        self.model_name = model_name
        self.host = host
        self.port = port
        self.default_max_tokens = default_max_tokens
        self.prompts = PromptCache()  # chat renders + token ids (a GRPO group repeats a prompt)
        self._background = BackgroundLoop("rllm-sampler-http")
        self._token_texts: dict[int, str] = {}  # decoded tokens of prompt_logprobs answers
        self._runner: web.AppRunner | None = None
        self._unserve: Callable[[], None] | None = None
        self.url = ""

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
        self._runner = web.AppRunner(app, access_log=None)
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
                    call = await self._chat_call(body)
                except RequestError as exc:
                    return 400, _dumps(exc.body())
                answer = await self._chat_answer(call)
            elif path == "/completions":
                try:
                    call = await self._completions_call(body)
                except RequestError as exc:
                    return 400, _dumps(exc.body())
                answer = await self._completions_answer(body, call)
            else:
                return 404, b"404: Not Found"
        except Exception:
            log.exception("internal error on %s (in process)", path)
            return 500, _INTERNAL_ERROR
        return 200, _dumps(answer)

    def abort(self) -> None:
        """``POST /v1/abort`` in process."""
        self.engine.abort_all()

    # handlers --------------------------------------------------------------------------------
    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "weight_version": self.engine.weight_version})

    async def _abort(self, request: web.Request) -> web.Response:
        self.engine.abort_all()
        return web.json_response({"aborted": True, "weight_version": self.engine.weight_version})

    async def _models(self, request: web.Request) -> web.Response:
        card = {
            "id": self.model_name,
            "object": "model",
            "created": 0,
            "owned_by": "rllm",
            "max_model_len": self.engine.max_positions,
        }
        return web.json_response({"object": "list", "data": [card]})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await _json_body(request)
            call = await self._chat_call(body)
        except RequestError as exc:
            return web.json_response(exc.body(), status=400)
        answer = await self._chat_answer(call)
        if body.get("stream"):
            return await send_stream(request, stream_chunks(answer, chat=True, usage=call.usage))
        return web.json_response(answer)

    async def _chat_call(self, body: dict[str, Any]) -> _Call:
        """A chat request checked and turned into its generation (RequestError: a 400)."""
        # Decoding and resizing images is CPU work: off the server's event loop.
        vision = await asyncio.to_thread(self._vision, body) if self.image_processor else None
        messages = parse_messages(body) if vision is None else body["messages"]
        prompt_ids = vision.input_ids if vision is not None else self._chat_prompt(body, messages)
        gen = parse_sampling(body, prompt_ids, self.default_max_tokens, self.engine.max_positions)
        gen.vision = vision
        want_logprobs = bool(body.get("logprobs", False))
        top = body.get("top_logprobs") or 0
        if not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS:
            raise RequestError(
                f"'top_logprobs' must be an integer in [0, {MAX_TOP_LOGPROBS}]", "top_logprobs"
            )
        gen.top_logprobs = top if want_logprobs else 0
        usage = include_usage(body)
        return _Call([prompt_ids], [gen], usage, want_logprobs, bool(body.get("return_token_ids", False)))

    async def _chat_answer(self, call: _Call) -> dict[str, Any]:
        seqs = await self.engine.submit_async(call.gens[0])
        return chat_response(
            self.model_name,
            call.prompts[0],
            seqs,
            self._decode_token,
            logprobs=call.logprobs,
            return_token_ids=call.return_token_ids,
        )

    def _chat_prompt(self, body: dict[str, Any], messages: list[dict[str, Any]]) -> list[int]:
        """The token ids of the rendered chat template (``prompt_cache``: a repeated prompt is
        rendered and tokenized once)."""
        add_generation_prompt = bool(body.get("add_generation_prompt", True))
        template_kwargs = body.get("chat_template_kwargs") or {}
        if not isinstance(template_kwargs, dict):
            raise RequestError("'chat_template_kwargs' must be an object", "chat_template_kwargs")
        tools = body.get("tools")
        if tools is not None:
            if not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
                raise RequestError("'tools' must be a list of objects", "tools")
            if "tools" in template_kwargs:
                raise RequestError("'tools' is given twice (also in 'chat_template_kwargs')", "tools")
            template_kwargs = {**template_kwargs, "tools": tools}
        key = prompt_key(messages, add_generation_prompt, template_kwargs)
        cached = self.prompts.get(key) if key is not None else None
        if cached is not None:
            return cached
        try:
            # tokenize=False renders one str (transformers' annotation covers every mode). The
            # tools go to the template, as vLLM passes them (a template without tools ignores them).
            text = cast(
                str,
                self.engine.tokenizer.apply_chat_template(
                    messages,
                    tokenize=False,
                    add_generation_prompt=add_generation_prompt,
                    **template_kwargs,
                ),
            )
        except Exception as exc:
            raise RequestError(f"the chat template could not render 'messages': {exc}", "messages") from exc
        ids = self._encode(text)
        if key is not None:
            self.prompts.put(key, ids)
        return ids

    def _vision(self, body: dict[str, Any]) -> Any:
        """The prompt's vision inputs when the messages hold image blocks and this server has an
        image processor; None otherwise (parse_messages then refuses images)."""
        messages = body.get("messages")
        if self.image_processor is None or not isinstance(messages, list):
            return None
        has_images = any(
            isinstance(m, dict)
            and isinstance(m.get("content"), list)
            and any(isinstance(b, dict) and b.get("type") == "image_url" for b in m["content"])
            for m in messages
        )
        if not has_images:
            return None
        from rllm.backends.tinker.vlm_prompt import render_vlm_prompt
        from rllm.types.images import ImageError

        try:
            return render_vlm_prompt(self.engine.tokenizer, self.image_processor, messages)
        except ImageError as exc:
            raise RequestError(f"{exc.reason} at {exc.field}", exc.field) from None
        except Exception as exc:
            raise RequestError(f"the messages could not be rendered with images: {exc}", "messages") from exc

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await _json_body(request)
            call = await self._completions_call(body)
        except RequestError as exc:
            return web.json_response(exc.body(), status=400)
        answer = await self._completions_answer(body, call)
        if body.get("stream"):
            return await send_stream(request, stream_chunks(answer, chat=False, usage=call.usage))
        return web.json_response(answer)

    async def _completions_call(self, body: dict[str, Any]) -> _Call:
        """A completions request checked and turned into its generations (RequestError: a 400)."""
        if body.get("echo"):
            raise RequestError("'echo' is not supported by the local sampler", "echo")
        prompts = parse_prompts(body, self._encode)
        vision = None
        if body.get("multi_modal_data") is not None:
            vision = await asyncio.to_thread(self._prompt_vision, body, prompts)
        logprobs = body.get("logprobs")
        if logprobs is not None and (
            not isinstance(logprobs, int)
            or isinstance(logprobs, bool)
            or not 0 <= logprobs <= MAX_TOP_LOGPROBS
        ):
            raise RequestError(f"'logprobs' must be an integer in [0, {MAX_TOP_LOGPROBS}]", "logprobs")
        gens = [parse_sampling(body, p, self.default_max_tokens, self.engine.max_positions) for p in prompts]
        for g in gens:
            g.top_logprobs = logprobs or 0
            g.vision = vision
        usage = include_usage(body)
        scored = body.get("prompt_logprobs")
        if scored is not None and (
            not isinstance(scored, int) or isinstance(scored, bool) or not 0 <= scored <= MAX_TOP_LOGPROBS
        ):
            raise RequestError(
                f"'prompt_logprobs' must be an integer in [0, {MAX_TOP_LOGPROBS}] (the prompt tokens' own "
                "logprobs and that many most likely tokens at each position)",
                "prompt_logprobs",
            )
        if scored is not None and vision is not None:
            raise RequestError("'prompt_logprobs' is not supported with images", "prompt_logprobs")
        return _Call(prompts, gens, usage, logprobs, bool(body.get("return_token_ids", False)), scored)

    async def _completions_answer(self, body: dict[str, Any], call: _Call) -> dict[str, Any]:
        prompts, logprobs = call.prompts, call.logprobs
        results = await asyncio.gather(*(self.engine.submit_async(g) for g in call.gens))
        # All prompts in one batched pass (a distillation step sends its sequences together).
        prompt_scores: list[list[Any]] | None = None
        if call.prompt_logprobs == 0:
            prompt_scores = await asyncio.to_thread(self.engine.prompt_logprobs_batch, prompts)
        elif call.prompt_logprobs is not None:  # top k: a distillation teacher's dense loss
            prompt_scores = await asyncio.to_thread(
                self.engine.prompt_topk_batch, prompts, call.prompt_logprobs
            )
        answer = completion_response(
            self.model_name,
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

    def _prompt_vision(self, body: dict[str, Any], prompts: list[list[int]]) -> Any:
        """The vision inputs of a token-id prompt sent with ``multi_modal_data: {"image": [data
        URIs in placeholder order]}``; RequestError naming the field for anything else."""
        from rllm.backends.tinker.vlm_prompt import token_prompt_vlm_inputs
        from rllm.types.images import ImageError, parse_data_uri

        data = body["multi_modal_data"]
        if self.image_processor is None:
            raise RequestError("this model takes no images ('multi_modal_data')", "multi_modal_data")
        urls = data.get("image") if isinstance(data, dict) else None
        if not isinstance(data, dict) or set(data) - {"image"} or not isinstance(urls, list):
            raise RequestError(
                "'multi_modal_data' must be {\"image\": [data URIs]} (images only)", "multi_modal_data"
            )
        prompt = body.get("prompt")
        if len(prompts) != 1 or not isinstance(prompt, list) or not all(isinstance(t, int) for t in prompt):
            raise RequestError(
                "'multi_modal_data' needs one prompt of token ids holding each image's placeholder tokens",
                "prompt",
            )
        try:
            images = [
                parse_data_uri(u if isinstance(u, str) else "", f"multi_modal_data.image[{k}]")[1]
                for k, u in enumerate(urls)
            ]
            inputs = token_prompt_vlm_inputs(
                self.engine.tokenizer, self.image_processor, prompts[0], images, "multi_modal_data.image"
            )
        except ImageError as exc:
            raise RequestError(f"{exc.reason} at {exc.field}", exc.field) from None
        except Exception as exc:  # the image processor's own failures are the request's fault too
            raise RequestError(f"the images could not be processed: {exc}", "multi_modal_data") from exc
        return inputs if inputs.pixel_values is not None else None  # no images: a plain token prompt

    # helpers ---------------------------------------------------------------------------------
    def _encode(self, text: str) -> list[int]:
        ids = self.engine.tokenizer(text, add_special_tokens=False)["input_ids"]
        if not ids:
            raise RequestError("the prompt is empty after tokenization", "prompt")
        return list(ids)

    @functools.lru_cache(maxsize=65536)  # noqa: B019 - the server lives as long as its tokenizer
    def _decode_token(self, token_id: int) -> str:
        return self.engine.decode([token_id])


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
