"""Cumulative mode renders a repeated chat once (a group's rollouts share their first messages):
a kept render is only ever handed out for exactly the messages and tools it was made from."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from rllm.gateway import cumulative
from rllm.gateway.cumulative import TokenBridge
from rllm.testing import build_tiny_chat_tokenizer

# A template that writes everything it is given, so two inputs that differ anywhere (a value, a
# type, the order of keys) render apart.
_EXACT = "{{ messages | tojson }}|{{ tools | tojson }}"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return AutoTokenizer.from_pretrained(build_tiny_chat_tokenizer(str(tmp_path_factory.mktemp("tok"))))


@pytest.fixture(scope="module")
def exact(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = _EXACT
    return tok


class Counting:
    """The real tokenizer, counting its chat renders."""

    def __init__(self, tokenizer) -> None:
        self._tok = tokenizer
        self.renders = 0

    def apply_chat_template(self, *args, **kwargs):
        self.renders += 1
        return self._tok.apply_chat_template(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._tok, name)


def _say(word: str) -> list[dict]:
    return [{"role": "user", "content": f"say: {word}"}]


def test_a_repeated_chat_is_rendered_once(tokenizer) -> None:
    counting = Counting(tokenizer)
    bridge = TokenBridge(counting)
    first = bridge.render(_say("apple"), None)
    assert first == TokenBridge(tokenizer)._render(_say("apple"), None)
    assert [bridge.render(_say("apple"), None) for _ in range(7)] == [first] * 7
    assert counting.renders == 1
    assert bridge.render(_say("river"), None) != first
    bridge.render(_say("apple"), [{"type": "function", "function": {"name": "f"}}])  # tools: another key
    assert counting.renders == 3


def test_key_order_and_json_types_render_apart(exact) -> None:
    bridge = TokenBridge(exact)
    variants = [
        [{"role": "user", "content": "x", "name": 1}],
        [{"role": "user", "content": "x", "name": 1.0}],
        [{"role": "user", "content": "x", "name": True}],
        [{"role": "user", "content": "x", "name": "1"}],
        [{"content": "x", "role": "user", "name": 1}],
    ]
    renders = [bridge.render(m, None) for m in variants]
    assert len(set(renders)) == len(variants)
    assert renders == [TokenBridge(exact)._render(m, None) for m in variants]


def test_inputs_that_are_not_json_values_render_uncached(tokenizer) -> None:
    counting = Counting(tokenizer)
    bridge = TokenBridge(counting)

    odd = [{"role": "user", "content": "x", "extra": object()}]
    bridge.render(odd, None)
    bridge.render(odd, None)
    assert counting.renders == 2


def test_long_chats_are_not_kept(tokenizer) -> None:
    counting = Counting(tokenizer)
    bridge = TokenBridge(counting)
    long = _say("apple " * (cumulative._ENCODE_CACHE_MAX_CHARS // 6 + 1))
    assert bridge.render(long, None) == bridge.render(long, None)
    assert counting.renders == 2


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.floats(-2, 2, allow_nan=False)
    | st.text("ab1", max_size=3),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text("abc", max_size=2), inner, max_size=3)
    ),
    max_leaves=8,
)
_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system"]), "content": st.text("ab \n", max_size=4)},
    optional={"name": _json, "extra": _json},
)
_tool = st.dictionaries(st.text("abc", max_size=2), _json, max_size=3)  # (templates take dicts)
_chat = st.tuples(st.lists(_message, min_size=1, max_size=3), st.none() | st.lists(_tool, max_size=2))


@settings(max_examples=80, deadline=None)
@given(st.lists(_chat, min_size=1, max_size=8))
def test_a_kept_render_is_always_the_render_of_the_same_inputs(exact, chats) -> None:
    bridge, fresh = TokenBridge(exact), TokenBridge(exact)
    for messages, tools in chats + chats[::-1]:  # every chat at least twice: once cold, once kept
        assert bridge.render(messages, tools) == fresh._render(messages, tools)
