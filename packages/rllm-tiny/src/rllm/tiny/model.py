"""A tiny random-init Llama and its word-level tokenizer, written to a directory (tests, toy tasks
and the ``model = "tiny"`` option of the backends).

Nothing is downloaded: the tokenizer is built from the given words (:mod:`rllm.tiny.tokenizer`)
and the model gets random weights. head_dim is at least 64 so vLLM and SGLang can serve the
checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rllm.tiny.tokenizer import build_tokenizer
from rllm.types.errors import InputError


def init_tiny_model(
    path: str | Path,
    vocab_words: Iterable[str] = (),
    seed: int = 0,
    *,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 2,
    intermediate_size: int = 256,
    max_positions: int = 1024,
    tool_calls: bool = False,
) -> Path:
    """Write a random-init Llama + tokenizer to ``path`` (a directory) and return it.

    ``vocab_words`` become single tokens (e.g. the toy task's word list). Deterministic for a seed.
    ``tool_calls`` builds the tokenizer with the hermes-style tool-call template.
    """
    tokenizer = build_tokenizer(vocab_words, tool_calls=tool_calls)
    return write_random_llama(
        path,
        tokenizer,
        seed,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        intermediate_size=intermediate_size,
        max_positions=max_positions,
    )


def write_random_llama(
    path: str | Path,
    tokenizer: Any,
    seed: int = 0,
    *,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 2,
    intermediate_size: int = 256,
    max_positions: int = 1024,
) -> Path:
    """Write a random-init Llama sized to ``tokenizer`` (its vocabulary, pad and eos ids) and the
    tokenizer itself to ``path``; returns it. Deterministic for a seed. For a test that needs
    another tokenizer than the word-level one (a byte-level BPE, a tool-call template)."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    if hidden_size % num_heads or hidden_size // num_heads < 64:
        raise InputError(f"tiny model: hidden_size/num_heads must be >= 64, got {hidden_size}/{num_heads}")
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    pad_token_id, eos_token_id = tokenizer.pad_token_id, tokenizer.eos_token_id
    if not isinstance(pad_token_id, int) or not isinstance(eos_token_id, int):
        raise InputError("write_random_llama: the tokenizer needs a pad and an eos token")
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=eos_token_id, pad_token_id=pad_token_id)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
