"""A tiny random Llama and a word-level tokenizer built locally (CPU tests, the GPU smoke run).

Nothing is downloaded. head_dim is 64 so vLLM and SGLang can serve the checkpoint. The chat
template renders "<|role|> content <|end|>" per message, so a generated "word <|end|>" re-renders
to exactly the sampled tokens and multi-turn prompts extend the previous turn token for token.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

SPECIALS = ["<|pad|>", "<|unk|>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|> ' + message['content'] + ' <|end|> ' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)
BASE_WORDS = [
    "say",
    "repeat",
    "the",
    "word",
    "answer",
    "is",
    "yes",
    "no",
    "ok",
    "please",
    "again",
    "now",
    "then",
    "you",
    "i",
    "it",
]
BASE_WORDS += [*"abcdefghijklmnopqrstuvwxyz0123456789", *":,.!?-'\"()=+*/"]


def build_tokenizer(words: Iterable[str] = ()) -> object:
    """A fast tokenizer with one token per word and punctuation mark (plus the chat specials)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab: dict[str, int] = {}
    for token in [*SPECIALS, *BASE_WORDS, *words]:
        pieces = [token] if token in SPECIALS else re.findall(r"\w+|[^\w\s]", token)
        for piece in pieces:
            vocab.setdefault(piece, len(vocab))
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|unk|>"))
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.Punctuation("isolated")]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|end|>",
        pad_token="<|pad|>",
        unk_token="<|unk|>",
        additional_special_tokens=SPECIALS[2:6],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def init_tiny_model(path: str | Path, vocab_words: Iterable[str] = (), seed: int = 0) -> Path:
    """Write a random 2-layer Llama (hidden 128, 2 heads of 64) and its tokenizer under ``path``."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(vocab_words)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
