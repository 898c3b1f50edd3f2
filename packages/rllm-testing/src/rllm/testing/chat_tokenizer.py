"""A tiny chat tokenizer trained locally: byte-level BPE with merges and a chat template.

Needs ``tokenizers`` and ``transformers`` (the ``rllm-testing[tokenizer]`` extra), imported when
a tokenizer is built.
"""

from __future__ import annotations

TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] or '' }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

_TINY_CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "reinforcement learning trains language agents with rewards",
    "echo: hello world, the answer is forty two",
    "turn after turn the agent talks to the model and the tools",
] * 50


def build_tiny_chat_tokenizer(path: str, vocab_size: int = 400) -> str:
    """Train a small byte-level BPE tokenizer locally and save it with a chat template at ``path``.

    Byte-level BPE with merges means a text sampled character by character re-tokenizes into
    different (merged) ids: detokenize→retokenize is not the identity, as with real models.
    Returns ``path`` (loadable with ``AutoTokenizer.from_pretrained``).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|end|>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|pad|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(_TINY_CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|end|>", pad_token="<|pad|>")
    fast.chat_template = TINY_CHAT_TEMPLATE
    fast.save_pretrained(path)
    return path


__all__ = ["TINY_CHAT_TEMPLATE", "build_tiny_chat_tokenizer"]
