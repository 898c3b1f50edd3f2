"""Small GGUF files written with the gguf package's own writer, for ``rllm model import``'s tests:
a tiny random Llama with a byte-level BPE vocabulary and a ChatML template (transformers' GGUF
loader reads it in seconds), and the non-model and broken files the importer must refuse.
Needs the ``gguf`` extra (gguf, numpy)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# ChatML without the assistant header a generation prompt opens: nothing can be sampled after it.
NO_GENERATION_PROMPT = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n' }}{% endfor %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
END_OF_TURN_ID = 2  # <|im_end|>
HIDDEN, HEADS, KV_HEADS, FFN, LAYERS = 32, 2, 1, 64, 2  # rows of 32: Q8_0 and Q4_x blocks


def byte_level_alphabet() -> list[str]:
    """GPT-2's byte → printable character table (bytes_to_unicode), in byte order."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars, extra = [], 0
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def vocabulary() -> tuple[list[str], list[str]]:
    """(tokens, merges): the special tokens, the 256 byte symbols and a few merged pairs."""
    merges = ["Ġ t", "h e", "Ġt he", "i s"]
    return [*SPECIALS, *byte_level_alphabet(), "Ġt", "he", "Ġthe", "is"], merges


def write_tiny_llama(
    path: Path,
    *,
    chat_template: str | None = CHATML,
    eos_id: int = 1,  # <|im_start|>: the wrong eos a converted SmolLM2 has, which the import fixes
    tensor_type: str = "F32",
    architecture: str = "llama",
    extra_tensor_type: str | None = None,  # one more tensor of this ggml type (an unreadable one)
    specials_as_text: bool = False,  # mark <|im_start|> etc. normal tokens: the conversion splits them
    seed: int = 0,
) -> Path:
    """A 2-layer Llama (hidden 32) with random weights; matrices in ``tensor_type``."""
    tokens, merges = vocabulary()
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_type("model")
    writer.add_name("tiny test llama")
    writer.add_context_length(128)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    special_type = 1 if specials_as_text else 3  # gguf's NORMAL or CONTROL
    writer.add_token_types([special_type] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)))
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(eos_id)
    writer.add_pad_token_id(END_OF_TURN_ID)
    writer.add_add_bos_token(False)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    rng = np.random.default_rng(seed)
    qtype = gguf.GGMLQuantizationType[tensor_type]

    def tensor(name: str, *shape: int) -> None:
        data = (rng.standard_normal(shape) * 0.1).astype(np.float32)
        if qtype == gguf.GGMLQuantizationType.F32 or len(shape) == 1:
            writer.add_tensor(name, data)
        else:
            writer.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)

    head_dim = HIDDEN // HEADS
    tensor("token_embd.weight", len(tokens), HIDDEN)
    for i in range(LAYERS):
        tensor(f"blk.{i}.attn_norm.weight", HIDDEN)
        tensor(f"blk.{i}.attn_q.weight", HIDDEN, HIDDEN)
        tensor(f"blk.{i}.attn_k.weight", KV_HEADS * head_dim, HIDDEN)
        tensor(f"blk.{i}.attn_v.weight", KV_HEADS * head_dim, HIDDEN)
        tensor(f"blk.{i}.attn_output.weight", HIDDEN, HIDDEN)
        tensor(f"blk.{i}.ffn_norm.weight", HIDDEN)
        tensor(f"blk.{i}.ffn_gate.weight", FFN, HIDDEN)
        tensor(f"blk.{i}.ffn_up.weight", FFN, HIDDEN)
        tensor(f"blk.{i}.ffn_down.weight", HIDDEN, FFN)
    tensor("output_norm.weight", HIDDEN)
    if extra_tensor_type is not None:
        extra = gguf.GGMLQuantizationType[extra_tensor_type]
        block_bytes = gguf.GGML_QUANT_SIZES[extra][1]
        writer.add_tensor("extra.weight", np.zeros((1, block_bytes), dtype=np.uint8), raw_dtype=extra)
    _finish(writer)
    return path


def write_vocab_only(path: Path) -> Path:
    """What llama.cpp ships as ggml-vocab-*.gguf: an architecture and a tokenizer, no tensors."""
    tokens, merges = vocabulary()
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_merges(merges)
    writer.add_chat_template(CHATML)
    _finish(writer)
    return path


def _finish(writer: gguf.GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
