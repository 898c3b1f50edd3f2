"""rllm.tiny: a tiny random-weight Llama and a word-level tokenizer, built locally.

What the training backends build for ``model = "tiny"`` and what tests train: nothing is
downloaded. Needs torch, transformers and tokenizers, imported when a model or tokenizer is built.
"""

from rllm.tiny.model import init_tiny_model, write_random_llama
from rllm.tiny.tokenizer import (
    CHAT_TEMPLATE,
    DEFAULT_WORDS,
    EOS_TOKEN,
    SPECIAL_TOKENS,
    TOOL_CALL_TOKENS,
    TOOL_CHAT_TEMPLATE,
    build_tokenizer,
)

__all__ = [
    "CHAT_TEMPLATE",
    "DEFAULT_WORDS",
    "EOS_TOKEN",
    "SPECIAL_TOKENS",
    "TOOL_CALL_TOKENS",
    "TOOL_CHAT_TEMPLATE",
    "build_tokenizer",
    "init_tiny_model",
    "write_random_llama",
]
