"""Chat data for supervised fine-tuning: OpenAI ``messages`` conversations to token sequences.

Each conversation is rendered with the model's own chat template and cut into per-message
spans by rendering every prefix of it: the tokens an assistant message adds after the
generation prompt (``add_generation_prompt=True`` on the messages before it) are trained
(loss mask 1); everything else — system, user and tool messages, the assistant header the
template writes, tool definitions — is context (loss mask 0). This is the same split the
sampler produces in RL: the policy is trained on the tokens it would itself generate.

A template that does not render a conversation's prefixes as token prefixes of the whole (a
template that rewrites earlier turns, e.g. one dropping past reasoning) cannot be cut this way
and is refused with the message where it diverges, never trained on a wrong mask.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import msgspec

from rllm.types import TrainSequence
from rllm.types.arrays import FloatArray, TokenArray
from rllm.types.errors import InputError

ROLES = ("system", "user", "assistant", "tool")


class ChatTokenizer(Protocol):
    """The part of a Hugging Face tokenizer the chat renderer uses."""

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def encode(self, text: str, **kwargs: Any) -> list[int]: ...


class ChatExample(msgspec.Struct, kw_only=True):
    """One conversation: OpenAI chat ``messages`` and, optionally, the ``tools`` offered."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    id: str = ""
    # Already tokenized (``rllm dataset from-eval``: the sampler's own ids): used as they are,
    # once the tokenizer that made them (its fingerprint, and the model it came from) is the
    # run's (rllm.engine.data.stored_ids).
    input_ids: list[int] | None = None
    loss_mask: list[float] | None = None
    tokenizer: str | None = None
    tokenizer_source: str = ""


def check_example(example: ChatExample, where: str) -> None:
    """Refuse a conversation rLLM cannot train on, naming ``where`` (file and line) and the message."""
    if example.input_ids is not None or example.loss_mask is not None:
        ids, mask = example.input_ids or [], example.loss_mask or []
        if len(ids) != len(mask) or not ids:
            raise InputError(f"{where}: `input_ids` and `loss_mask` must be non-empty and of one length")
        if not all(isinstance(t, int) and t >= 0 for t in ids) or not set(mask) <= {0, 1}:
            raise InputError(f"{where}: `input_ids` must be token ids and `loss_mask` 0s and 1s")
        if not any(mask[1:]):
            raise InputError(f"{where}: no trained token (every loss_mask is 0 after token 0)")
        return
    if not example.messages:
        raise InputError(f"{where}: `messages` is empty")
    for i, message in enumerate(example.messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            role = message.get("role") if isinstance(message, dict) else type(message).__name__
            raise InputError(f"{where}: message {i} has role {role!r} (expected one of {', '.join(ROLES)})")
    if not any(m["role"] == "assistant" for m in example.messages):
        raise InputError(f"{where}: no assistant message, so no token to train on")


def read_chat_jsonl(path: str | Path) -> list[ChatExample]:
    """OpenAI fine-tuning JSONL: one ``{"messages": [...], "tools": [...]}`` object a line."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"chat dataset {path} does not exist")
    examples: list[ChatExample] = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{where}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict) or not isinstance(row.get("messages"), list):
            raise InputError(f"{where}: each line needs a `messages` list (OpenAI chat format)")
        tools = row.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise InputError(f"{where}: `tools` must be a list")
        tokenizer, source = row.get("tokenizer"), row.get("tokenizer_source", "")
        if tokenizer is not None and not (isinstance(tokenizer, str) and isinstance(source, str)):
            raise InputError(f"{where}: `tokenizer` and `tokenizer_source` must be text")
        example = ChatExample(
            messages=row["messages"],
            tools=tools,
            id=str(row.get("id", number)),
            input_ids=row.get("input_ids"),
            loss_mask=row.get("loss_mask"),
            tokenizer=tokenizer,
            tokenizer_source=source,
        )
        check_example(example, where)
        examples.append(example)
    if not examples:
        raise InputError(f"chat dataset {path} holds no conversation")
    return examples


def _render(
    tokenizer: ChatTokenizer, messages: list[dict[str, Any]], tools: Any, generation_prompt: bool
) -> list[int]:
    kwargs: dict[str, Any] = {"add_generation_prompt": generation_prompt, "tokenize": False}
    if tools:
        kwargs["tools"] = tools
    text = tokenizer.apply_chat_template(messages, **kwargs)
    return list(tokenizer.encode(text, add_special_tokens=False))


def tokenize_chat(tokenizer: ChatTokenizer, example: ChatExample, max_tokens: int = 0) -> TrainSequence:
    """The conversation as one sequence whose loss mask covers the assistant tokens only.

    ``max_tokens`` > 0 cuts the sequence there (the tail of a long conversation is dropped, with
    its mask). Raises InputError when the template does not extend prefixes token for token.
    """
    check_example(example, f"conversation {example.id!r}")
    if example.input_ids is not None and example.loss_mask is not None:
        return _sequence(
            example.input_ids[: max_tokens or None], example.loss_mask[: max_tokens or None], example
        )
    ids: list[int] = []
    mask: list[float] = []
    for i, message in enumerate(example.messages):
        if message["role"] == "assistant":
            # The header the template writes before a reply is context, as in sampling.
            header = _render(tokenizer, example.messages[:i], example.tools, True)
            _extend(ids, mask, header, 0.0, example, i)
        full = _render(tokenizer, example.messages[: i + 1], example.tools, False)
        _extend(ids, mask, full, 1.0 if message["role"] == "assistant" else 0.0, example, i)
    if max_tokens > 0:
        ids, mask = ids[:max_tokens], mask[:max_tokens]
    if not any(mask[1:]):
        raise InputError(
            f"conversation {example.id!r}: no assistant token to train on"
            + (f" within max_tokens={max_tokens}" if max_tokens > 0 else "")
        )
    return _sequence(ids, mask, example)


def _sequence(ids: list[int], mask: list[float], example: ChatExample) -> TrainSequence:
    if not any(mask[1:]):
        raise InputError(f"conversation {example.id!r}: no trained token within max_tokens")
    n = len(ids)
    return TrainSequence(
        input_ids=TokenArray(ids),
        loss_mask=FloatArray(mask),
        advantages=FloatArray([0.0] * n),
        sampler_logprobs=FloatArray([0.0] * n),
        group_id=example.id,
        metadata={"source": "chat"},
    )


def _extend(
    ids: list[int], mask: list[float], rendered: list[int], value: float, example: ChatExample, index: int
) -> None:
    """Append what ``rendered`` adds after ``ids``; it must start with ``ids`` exactly."""
    if rendered[: len(ids)] != ids:
        at = next((k for k, (a, b) in enumerate(zip(ids, rendered, strict=False)) if a != b), len(rendered))
        raise InputError(
            f"conversation {example.id!r}: the chat template does not render message {index} as an "
            f"extension of the messages before it (tokens differ at position {at}); "
            "assistant-only loss masks need a prefix-extending template"
        )
    added = rendered[len(ids) :]
    ids.extend(added)
    mask.extend([value] * len(added))


def tokenize_all(
    tokenizer: ChatTokenizer, examples: Sequence[ChatExample], max_tokens: int = 0
) -> list[TrainSequence]:
    return [tokenize_chat(tokenizer, example, max_tokens) for example in examples]


__all__ = [
    "ROLES",
    "ChatExample",
    "ChatTokenizer",
    "check_example",
    "read_chat_jsonl",
    "tokenize_all",
    "tokenize_chat",
]
