"""Chat data → TrainSequences: only assistant tokens are trained, whatever the conversation's shape."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rllm.engine.data.chat_data import ChatExample, read_chat_jsonl, tokenize_chat
from rllm.types.errors import InputError

# Assistant replies use only these words; the other roles never do, so a trained token's word
# tells whose it is.
ASSISTANT_WORDS = ["apple", "banana", "cherry", "grape"]
OTHER_WORDS = ["red", "green", "blue", "cat", "dog"]


@cache
def tokenizer() -> Any:
    from rllm.tiny.tokenizer import build_tokenizer

    return build_tokenizer(["add", "name", "arguments"], tool_calls=True)


words = st.lists(st.sampled_from(OTHER_WORDS), min_size=1, max_size=4).map(" ".join)
replies = st.lists(st.sampled_from(ASSISTANT_WORDS), min_size=1, max_size=4).map(" ".join)


@st.composite
def conversations(draw: st.DrawFn) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(words)})
    for _ in range(draw(st.integers(1, 4))):
        messages.append({"role": "user", "content": draw(words)})
        if draw(st.booleans()):  # a tool call, its output (context), then the final reply
            call = {"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}
            messages.append({"role": "assistant", "content": draw(replies), "tool_calls": [call]})
            messages.append({"role": "tool", "content": draw(words)})
        messages.append({"role": "assistant", "content": draw(replies)})
    return messages


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversations(), st.booleans())
def test_only_assistant_tokens_count(messages: list[dict[str, Any]], with_tools: bool) -> None:
    tok = tokenizer()
    tools = [{"type": "function", "function": {"name": "add"}}] if with_tools else None
    seq = tokenize_chat(tok, ChatExample(messages=messages, tools=tools, id="c"))
    ids, mask = list(seq.input_ids), list(seq.loss_mask)
    assert len(ids) == len(mask) == len(seq.advantages) == len(seq.sampler_logprobs)
    # The sequence is exactly the template's rendering of the whole conversation.
    kwargs = {"tools": tools} if tools else {}
    whole = tok.encode(tok.apply_chat_template(messages, tokenize=False, **kwargs), add_special_tokens=False)
    assert ids == whole
    pieces = tok.convert_ids_to_tokens(ids)
    trained = [p for p, m in zip(pieces, mask, strict=True) if m == 1.0]
    context = [p for p, m in zip(pieces, mask, strict=True) if m == 0.0]
    assert set(mask) <= {0.0, 1.0}
    # Every assistant word is trained, no other role's word is, and role headers never are.
    assistant = [w for m in messages if m["role"] == "assistant" for w in m["content"].split()]
    assert [p for p in trained if p in ASSISTANT_WORDS] == assistant
    assert not any(p in ASSISTANT_WORDS for p in context)
    assert not any(p in OTHER_WORDS for p in trained)
    assert not any(p in ("<|system|>", "<|user|>", "<|assistant|>", "<|tool|>") for p in trained)
    # Each assistant message's end token is trained (the policy learns to stop); no other's is.
    assert trained.count("<|end|>") == sum(m["role"] == "assistant" for m in messages)


def test_a_template_that_rewrites_history_is_refused() -> None:
    tok = tokenizer()
    # A template that shows only the last assistant reply (like ones that drop past reasoning).
    original = tok.chat_template
    tok.chat_template = (
        "{% for m in messages %}{% if m['role'] != 'assistant' or loop.last %}"
        "{{ '<|' + m['role'] + '|> ' + m['content'] + ' <|end|> ' }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
    )
    try:
        messages = [
            {"role": "user", "content": "red"},
            {"role": "assistant", "content": "apple"},
            {"role": "user", "content": "blue"},
            {"role": "assistant", "content": "grape"},
        ]
        with pytest.raises(InputError, match="message 2 as an extension"):
            tokenize_chat(tok, ChatExample(messages=messages, id="x"))
    finally:
        tok.chat_template = original


def test_jsonl_errors_name_the_line(tmp_path) -> None:
    good = {"messages": [{"role": "user", "content": "red"}, {"role": "assistant", "content": "apple"}]}
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps(good) + "\n\n" + json.dumps({"messages": [{"role": "user", "content": "x"}]}))
    with pytest.raises(InputError, match=r"chat.jsonl:3: no assistant message"):
        read_chat_jsonl(path)
    path.write_text(json.dumps(good) + "\n{oops\n")
    with pytest.raises(InputError, match=r"chat.jsonl:2: not JSON"):
        read_chat_jsonl(path)
    path.write_text(json.dumps({"messages": [{"role": "robot", "content": "x"}]}))
    with pytest.raises(InputError, match="message 0 has role 'robot'"):
        read_chat_jsonl(path)
    path.write_text(json.dumps(good) + "\n")
    (example,) = read_chat_jsonl(path)
    assert example.messages == good["messages"] and example.tools is None
