"""A tiny random-init Llama and a word-level tokenizer, built locally (tests and toy tasks).

Nothing is downloaded: the tokenizer is trained with ``tokenizers`` on the given words and the
model gets random weights. head_dim is 64 so vLLM could serve the same checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

SPECIAL_TOKENS = ["<|pad|>", "<|unk|>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|end|>"]
EOS_TOKEN = "<|end|>"

# Each message renders as "<|role|> content <|end|>"; the generation prompt is "<|assistant|>".
# A generated reply "word <|end|>" therefore re-renders to exactly the tokens the sampler produced,
# so multi-turn histories extend the previous turn token for token.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|> ' + message['content'] + ' <|end|> ' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)

# The same shape with native tool calls, hermes style (the gateway's cumulative mode parses
# ``<tool_call>{json}</tool_call>``): for cookbooks whose agents call tools (e.g. FinQA).
TOOL_CALL_TOKENS = ["<tool_call>", "</tool_call>"]
TOOL_CHAT_TEMPLATE = (
    "{% if tools %}{{ '<|system|> tools : ' }}{% for tool in tools %}{{ tool | tojson + ' ' }}{% endfor %}"
    "{{ '<tool_call> {\"name\": name, \"arguments\": arguments} </tool_call> <|end|> ' }}{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'tool' %}{{ '<|tool|> ' + message['content'] + ' <|end|> ' }}"
    "{% elif message.get('tool_calls') %}{{ '<|assistant|> ' + (message['content'] or '') + ' ' }}"
    "{% for call in message['tool_calls'] %}{{ '<tool_call> ' + "
    "{'name': call['function']['name'], 'arguments': call['function']['arguments']} | tojson"
    " + ' </tool_call> ' }}{% endfor %}{{ '<|end|> ' }}"
    "{% else %}{{ '<|' + message['role'] + '|> ' + (message['content'] or '') + ' <|end|> ' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)

DEFAULT_WORDS = [
    "say", "repeat", "the", "word", "answer", "is", "a", "an", "and", "or", "not", "yes", "no",
    "ok", "please", "again", "now", "then", "next", "last", "first", "turn", "you", "i", "it",
    "apple", "banana", "cherry", "grape", "lemon", "mango", "melon", "peach", "pear", "plum",
    "red", "green", "blue", "black", "white", "cat", "dog", "bird", "fish", "sun", "moon", "star",
    *"abcdefghijklmnopqrstuvwxyz", *"0123456789",
    ":", ",", ".", "!", "?", "-", "'", '"', "(", ")", "=", "+", "*", "/",
]  # fmt: skip


def build_tokenizer(words: Iterable[str] = (), *, tool_calls: bool = False) -> object:
    """A PreTrainedTokenizerFast with one token per word (plus DEFAULT_WORDS and specials).

    ``tool_calls``: the hermes-style :data:`TOOL_CHAT_TEMPLATE` and its ``<tool_call>`` tokens
    (ordinary added tokens, so they survive decoding like Qwen's)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab: dict[str, int] = {}
    for token in [*SPECIAL_TOKENS, *DEFAULT_WORDS, *words]:
        for piece in _pre_tokenize(token):
            vocab.setdefault(piece, len(vocab))
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|unk|>"))
    core.pre_tokenizer = _pre_tokenizer()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token=EOS_TOKEN,
        pad_token="<|pad|>",
        unk_token="<|unk|>",
        additional_special_tokens=[t for t in SPECIAL_TOKENS if t not in ("<|pad|>", "<|unk|>", EOS_TOKEN)],
    )
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE if tool_calls else CHAT_TEMPLATE
    if tool_calls:
        tokenizer.add_tokens(TOOL_CALL_TOKENS)
    return tokenizer


def _pre_tokenizer() -> object:
    """Words (``\\w+``) and single punctuation characters, like the regex ``\\w+|[^\\w\\s]``."""
    from tokenizers import pre_tokenizers

    return pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.Punctuation("isolated")])


def _pre_tokenize(text: str) -> list[str]:
    """Split like the tokenizer will, so every vocabulary entry is reachable."""
    if text.startswith("<|") and text.endswith("|>"):
        return [text]
    return [piece for piece, _ in _pre_tokenizer().pre_tokenize_str(text)]


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
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    if hidden_size % num_heads or hidden_size // num_heads < 64:
        raise ValueError(
            f"init_tiny_model: hidden_size/num_heads must be >= 64, got {hidden_size}/{num_heads}"
        )
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(vocab_words, tool_calls=tool_calls)
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
