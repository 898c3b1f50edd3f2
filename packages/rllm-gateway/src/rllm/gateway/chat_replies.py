"""A cumulative-mode call's answer in the shape the agent asked for.

In cumulative mode (``rllm.gateway.cumulative``) a chat call goes upstream as a completions call
with token ids; here the upstream's completions answer, whole (``chat_completion``) or chunk by
chunk (``chat_chunk``), becomes the ``chat.completion`` the agent expects, with the tool calls
and reasoning ``TokenBridge.commit`` parsed out of it and per-token logprobs decoded by the
model's tokenizer. ``confirm_images`` holds the upstream to its word that the model saw every
image of the prompt.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any

from rllm.gateway.capture import Captured, UpstreamShapeError
from rllm.gateway.cumulative import IMAGES_FIELD, IMAGES_USED

if TYPE_CHECKING:
    from rllm.gateway.cumulative import BridgePlan


def chat_completion(tokenizer: Any, data: dict[str, Any], cap: Captured, plan: BridgePlan) -> dict[str, Any]:
    """A completions response re-shaped as the chat.completion the client asked for.

    With images, the upstream must say it gave them all to the model; an upstream that
    ignored ``multi_modal_data`` answered without seeing them, which is a 502 (and the turn
    is not remembered as one to extend), never a trace that looks fine."""
    confirm_images(plan, data.get(IMAGES_USED))
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": cap.text or None if cap.tool_calls else cap.text},
        "logprobs": None,
        "finish_reason": cap.finish_reason,
    }
    if cap.tool_calls:
        choice["message"]["tool_calls"] = cap.tool_calls
    if cap.reasoning:
        choice["message"]["reasoning_content"] = cap.reasoning
    if plan.wants_logprobs and cap.completion_ids and cap.completion_logprobs:
        choice["logprobs"] = {
            "content": [
                _lp_entry(tokenizer, t, lp)
                for t, lp in zip(cap.completion_ids, cap.completion_logprobs, strict=False)
            ]
        }
    upstream_id = data.get("id")  # (a fresh one only when missing: uuid4 is an os.urandom call)
    out = {
        "id": "chatcmpl-"
        + (str(upstream_id).removeprefix("cmpl-") if upstream_id is not None else uuid.uuid4().hex),
        "object": "chat.completion",
        "created": data.get("created", int(time.time())),
        "model": data.get("model", ""),
        "choices": [choice],
        "usage": data.get("usage"),
    }
    if plan.wants_token_ids:
        out["prompt_token_ids"] = plan.prompt_ids
        choice["token_ids"] = cap.completion_ids
    return out


def confirm_images(plan: BridgePlan, used: Any) -> None:
    """UpstreamShapeError unless the upstream said it gave the model all of the prompt's
    images (``used``, its ``images_used``); the turn is then not one to extend."""
    if not plan.images or used == len(plan.images):
        return
    if plan.session is not None:
        plan.session.bridges.pop(plan.role, None)
    raise UpstreamShapeError(
        f"the upstream did not confirm it used the prompt's {len(plan.images)} image(s) "
        f"(cumulative mode sends them as '{IMAGES_FIELD}' and needs '{IMAGES_USED}' back, as "
        "the local tinker sampler answers; vLLM's OpenAI server takes no images with token "
        "ids): use tokenizer_mode='plain' with this upstream"
    )


def chat_chunk(tokenizer: Any, chunk: dict[str, Any], plan: BridgePlan) -> dict[str, Any]:
    """A completions stream chunk re-shaped as a chat.completion.chunk (a gpt-oss reply split
    into channels as its ids arrive); an ``images_used`` it carries is kept on ``plan``."""
    if IMAGES_USED in chunk:
        plan.images_used = chunk[IMAGES_USED]
    choices = []
    for c in chunk.get("choices") or ():
        delta: dict[str, Any] = {}
        finish = c.get("finish_reason")
        ids = c.get("token_ids")
        if plan.harmony is not None and isinstance(ids, list) and c.get("index", 0) == 0:
            delta = plan.harmony.feed(ids)
        elif c.get("text"):
            delta["content"] = c["text"]
        if finish == "stop" and plan.harmony is not None and plan.harmony.calls:
            finish = "tool_calls"  # as the non-streamed reply says
        out_c: dict[str, Any] = {
            "index": c.get("index", 0),
            "delta": delta,
            "logprobs": None,
            "finish_reason": finish,
        }
        lp = c.get("logprobs")
        if plan.wants_logprobs and isinstance(lp, dict) and c.get("token_ids"):
            out_c["logprobs"] = {
                "content": [
                    _lp_entry(tokenizer, t, x)
                    for t, x in zip(c["token_ids"], lp.get("token_logprobs") or [], strict=False)
                ]
            }
        choices.append(out_c)
    out = {
        "id": "chatcmpl-" + str(chunk.get("id", "")).removeprefix("cmpl-"),
        "object": "chat.completion.chunk",
        "created": chunk.get("created", int(time.time())),
        "model": chunk.get("model", ""),
        "choices": choices,
    }
    if chunk.get("usage") and plan.wants_usage:  # none for a client that did not ask
        out["usage"] = chunk["usage"]
    return out


def _lp_entry(tokenizer: Any, token_id: int, logprob: float) -> dict[str, Any]:
    tok = tokenizer.decode([token_id])
    return {"token": tok, "logprob": logprob, "bytes": list(tok.encode()), "top_logprobs": []}


__all__ = ["chat_chunk", "chat_completion", "confirm_images"]
