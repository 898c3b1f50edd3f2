"""The locally built tiny model and tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoConfig, AutoTokenizer

from rllm.tiny import build_tokenizer, init_tiny_model

WORDS = ["apple", "banana", "cherry", "grape", "lemon", "mango", "peach", "plum"]


@pytest.fixture(scope="module")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_tiny_model(tmp_path_factory.mktemp("tiny") / "model", vocab_words=WORDS, seed=0)


def test_words_are_single_tokens_and_the_chat_template_round_trips(tiny_model_path: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    for word in [*WORDS, "say", ":"]:
        ids = tokenizer(word, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1 and ids[0] != tokenizer.unk_token_id, word
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "say: plum"}, {"role": "assistant", "content": "plum"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "say : plum plum"
    assert ids.count(tokenizer.eos_token_id) == 2 and tokenizer.eos_token == "<|end|>"
    assert tokenizer.convert_ids_to_tokens(ids[-1]) == "<|assistant|>"


def test_model_shape_is_servable(tiny_model_path: Path) -> None:
    config = AutoConfig.from_pretrained(tiny_model_path)
    assert config.model_type == "llama" and config.head_dim >= 64 and config.num_hidden_layers == 2
    assert config.eos_token_id == AutoTokenizer.from_pretrained(tiny_model_path).eos_token_id


def test_tool_call_template_renders_calls_and_results(tmp_path: Path) -> None:
    tokenizer = build_tokenizer(["get", "city", "paris"], tool_calls=True)
    tokenizer.save_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)  # the template and added tokens persist
    call = {"id": "c1", "type": "function", "function": {"name": "get", "arguments": {"city": "paris"}}}
    text = tokenizer.apply_chat_template(
        [
            {"role": "user", "content": "get"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "paris"},
        ],
        tools=[{"type": "function", "function": {"name": "get"}}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert (
        '<tool_call> {"name": "get", "arguments": {"city": "paris"}} </tool_call> <|end|> <|tool|> paris'
        in text
    )
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    # <tool_call> is one ordinary token: it survives decoding, as a parser needs.
    assert tokenizer.convert_tokens_to_ids("<tool_call>") in ids
    assert "<tool_call>" in tokenizer.decode(ids, skip_special_tokens=True)


def test_the_same_seed_writes_the_same_weights(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    a = load_file(init_tiny_model(tmp_path / "a", WORDS, seed=3) / "model.safetensors")
    b = load_file(init_tiny_model(tmp_path / "b", WORDS, seed=3) / "model.safetensors")
    assert a.keys() == b.keys() and all(bool((a[k] == b[k]).all()) for k in a)


def test_a_head_narrower_than_64_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="hidden_size/num_heads"):
        init_tiny_model(tmp_path / "m", hidden_size=128, num_heads=4)
