"""The word-level tokenizer of the tiny model: one token per word, built locally from a word list.

Nothing is downloaded: the vocabulary is the given words plus :data:`DEFAULT_WORDS` and the chat
specials, and the chat template renders "<|role|> content <|end|>" per message.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenizers.pre_tokenizers import PreTokenizer
    from transformers import PreTrainedTokenizerFast

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
    '{{ \'<tool_call> {"name": name, "arguments": arguments} </tool_call> <|end|> \' }}{% endif %}'
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


def build_tokenizer(words: Iterable[str] = (), *, tool_calls: bool = False) -> PreTrainedTokenizerFast:
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


def _pre_tokenizer() -> PreTokenizer:
    """Words (``\\w+``) and single punctuation characters, like the regex ``\\w+|[^\\w\\s]``."""
    from tokenizers import pre_tokenizers

    return pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.Punctuation("isolated")])


def _pre_tokenize(text: str) -> list[str]:
    """Split like the tokenizer will, so every vocabulary entry is reachable."""
    if text.startswith("<|") and text.endswith("|>"):
        return [text]
    return [piece for piece, _ in _pre_tokenizer().pre_tokenize_str(text)]
