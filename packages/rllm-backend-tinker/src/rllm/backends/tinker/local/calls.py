"""The local sampler server's requests read: a chat or completions body checked and turned into
the generations it asks for (:class:`Call`), a :class:`RequestError` (a 400) otherwise.

Chat templates are rendered once per distinct prompt (``prompt_cache``), images decoded and
resized off the event loop, prompts tokenized. Both the HTTP routes and the in-process calls of
:class:`rllm.backends.tinker.local.server.SamplerServer` read requests here, so both answer alike.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, cast

from rllm.backends.tinker.local.generation import GenerationRequest, SamplerEngine
from rllm.backends.tinker.local.prompt_cache import PromptCache, prompt_key
from rllm.backends.tinker.local.protocol import (
    MAX_TOP_LOGPROBS,
    RequestError,
    parse_messages,
    parse_prompts,
    parse_sampling,
)
from rllm.backends.tinker.local.streaming import include_usage
from rllm.gateway.tool_parser import ToolCallParser
from rllm.gateway.toolcalls import UNSUPPORTED_TOOLS, to_template_messages


@dataclass(slots=True)
class Call:
    """A checked request, ready to generate: one prompt (chat) or several (completions)."""

    prompts: list[list[int]]
    gens: list[GenerationRequest]
    usage: bool
    logprobs: Any  # chat: whether to return them; completions: how many top ones (or None)
    return_token_ids: bool
    prompt_logprobs: int | None = None  # vLLM's: None (off), 0 (the tokens' own), k (and the top k)
    tools: bool = False  # chat with ``tools``: each reply is split into content and tool_calls


class CallReader:
    """Reads the requests of one sampler server (its engine's tokenizer and context length)."""

    def __init__(self, engine: SamplerEngine, default_max_tokens: int, image_processor: Any = None) -> None:
        self.engine = engine
        self.default_max_tokens = default_max_tokens
        # With an image processor (a vision-language model) chat messages may hold data-URI
        # image blocks (vlm_prompt.render_vlm_prompt), and a token-id completions prompt may come
        # with its images (``multi_modal_data``, as the gateway's cumulative mode sends it);
        # without one they are refused with a 400.
        self.image_processor = image_processor
        self.prompts = PromptCache()  # chat renders + token ids (a GRPO group repeats a prompt)
        # The model's tool-call format, parsed as vLLM does with a tool-call parser (and as the
        # cumulative gateway does): the same agent gets tool_calls in eval and in training.
        self.tool_calls = ToolCallParser(engine.tokenizer)

    async def chat(self, body: dict[str, Any]) -> Call:
        """A chat request checked and turned into its generation (RequestError: a 400)."""
        # Decoding and resizing images is CPU work: off the server's event loop.
        vision = await asyncio.to_thread(self._vision, body) if self.image_processor else None
        messages = parse_messages(body) if vision is None else body["messages"]
        prompt_ids = vision.input_ids if vision is not None else self.chat_prompt(body, messages)
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
        tools = bool(body.get("tools"))
        return Call(
            [prompt_ids], [gen], usage, want_logprobs, bool(body.get("return_token_ids", False)), tools=tools
        )

    def chat_prompt(self, body: dict[str, Any], messages: list[dict[str, Any]]) -> list[int]:
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
            if tools and self.tool_calls.format is None:
                # A template without tools would drop them silently and the agent would never
                # get a call back: refused, as vLLM refuses tools without a tool-call parser.
                raise RequestError(UNSUPPORTED_TOOLS, "tools")
            template_kwargs = {**template_kwargs, "tools": tools}
        # Tool-call arguments go to the template as objects, not the API's JSON text.
        messages = to_template_messages(messages)
        key = prompt_key(messages, add_generation_prompt, template_kwargs)
        cached = self.prompts.get(key) if key is not None else None
        if cached is not None:
            return cached
        try:
            # tokenize=False renders one str (transformers' annotation covers every mode).
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
        ids = self.encode(text)
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

    async def completions(self, body: dict[str, Any]) -> Call:
        """A completions request checked and turned into its generations (RequestError: a 400)."""
        if body.get("echo"):
            raise RequestError("'echo' is not supported by the local sampler", "echo")
        prompts = parse_prompts(body, self.encode)
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
        return Call(prompts, gens, usage, logprobs, bool(body.get("return_token_ids", False)), scored)

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

    def encode(self, text: str) -> list[int]:
        ids = self.engine.tokenizer(text, add_special_tokens=False)["input_ids"]
        if not ids:
            raise RequestError("the prompt is empty after tokenization", "prompt")
        return list(ids)
