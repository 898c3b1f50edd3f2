"""Cumulative mode encodes a repeated prompt text once (a group's rollouts share their first
prompt), and every caller still gets its own list with exactly the tokenizer's ids."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from rllm.gateway import cumulative
from rllm.gateway.cumulative import TokenBridge
from rllm.testing import build_tiny_chat_tokenizer


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return AutoTokenizer.from_pretrained(build_tiny_chat_tokenizer(str(tmp_path_factory.mktemp("tok"))))


class Counting:
    """The real tokenizer, counting its encode calls."""

    def __init__(self, tokenizer) -> None:
        self._tok = tokenizer
        self.encodes = 0

    def encode(self, *args, **kwargs):
        self.encodes += 1
        return self._tok.encode(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._tok, name)


def test_a_repeated_prompt_is_encoded_once_and_each_caller_owns_its_list(tokenizer) -> None:
    counting = Counting(tokenizer)
    bridge = TokenBridge(counting)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "say: apple"}], add_generation_prompt=True, tokenize=False
    )
    first = bridge.encode(text)
    assert first == tokenizer.encode(text, add_special_tokens=False)
    first.append(-1)  # a caller extending its prompt (the next turn does) ...
    second = bridge.encode(text)
    assert second == first[:-1]  # ... does not change what the next caller gets
    assert second is not bridge.encode(text)
    assert counting.encodes == 1


def test_long_texts_are_not_kept(tokenizer) -> None:
    counting = Counting(tokenizer)
    bridge = TokenBridge(counting)
    text = "hello world " * (cumulative._ENCODE_CACHE_MAX_CHARS // 12 + 1)
    assert bridge.encode(text) == bridge.encode(text) == tokenizer.encode(text, add_special_tokens=False)
    assert counting.encodes == 2


@settings(max_examples=40, deadline=None)
@given(st.lists(st.text(alphabet="abc <>|\n", max_size=30), min_size=1, max_size=12))
def test_cached_ids_equal_the_tokenizers_for_any_sequence_of_texts(tokenizer, texts) -> None:
    bridge = TokenBridge(tokenizer)
    for text in texts + texts:
        assert bridge.encode(text) == tokenizer.encode(text, add_special_tokens=False)
