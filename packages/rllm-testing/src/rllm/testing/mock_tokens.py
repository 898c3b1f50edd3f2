"""How the mock upstream turns text into token ids and back, and its deterministic logprobs.

Without a tokenizer a text's ids are its UTF-8 bytes (a byte-level "tokenizer", so ``len(ids)``
is predictable). With a transformers tokenizer, prompts are rendered with its chat template and a
reply is tokenized character by character: a valid but non-canonical tokenization, just as a real
sampler produces, so re-tokenizing the reply's text does not give back its ids.
"""

from __future__ import annotations

from typing import Any

import msgspec

from rllm.types.openai import ChatLogprobs, CompletionLogprobs, completion_logprobs, token_logprob

_json_encode = msgspec.json.Encoder().encode


def logprob_of(token_id: int) -> float:
    """The mock's logprob of a token: deterministic, strictly negative and varied, so tests can
    check them exactly."""
    return -((token_id % 13) + 1) / 16.0


class MockTokens:
    """Token ids of prompts and replies, their texts, and their logprob entries."""

    def __init__(self, tokenizer: Any = None) -> None:
        self.tokenizer = tokenizer
        self.eos_id: int | None = None if tokenizer is None else tokenizer.eos_token_id
        # Per token id, the chat logprob entry already encoded as JSON: a benchmark's upstream
        # should spend its CPU on HTTP, not on rebuilding and re-encoding the same entries.
        self._chat_entries: dict[int, bytes] = {}

    def encode_text(self, text: str) -> list[int]:
        """Sampler-style ids for ``text``: per character with a tokenizer, else UTF-8 bytes."""
        if self.tokenizer is None:
            return list(text.encode())
        ids: list[int] = []
        for ch in text:
            tid = self.tokenizer.convert_tokens_to_ids(self._byte_level(ch))
            if tid is None or tid == self.tokenizer.unk_token_id:
                ids.extend(self.tokenizer.encode(ch, add_special_tokens=False))
            else:
                ids.append(tid)
        return ids

    def encode_prompt(self, prompt: str) -> list[int]:
        """A completions prompt's ids, as the tokenizer (or the byte-level default) encodes it."""
        return list(prompt.encode()) if self.tokenizer is None else self.tokenizer.encode(prompt)

    def _byte_level(self, ch: str) -> str:
        # The tokenizer's own pre-tokenizer maps a character to its vocabulary symbol(s).
        pre = self.tokenizer.backend_tokenizer.pre_tokenizer
        if pre is None:
            return ch
        pieces = pre.pre_tokenize_str(ch)
        return "".join(p for p, _ in pieces) if pieces else ch

    def token_text(self, token_id: int) -> str:
        if self.tokenizer is None:
            return bytes([token_id]).decode("latin-1") if token_id < 256 else f"<{token_id}>"
        return self.tokenizer.decode([token_id])

    def decode(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return bytes(i for i in ids if i < 256).decode(errors="replace")
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def render_chat(self, messages: list[dict[str, Any]], tools: Any = None) -> list[int]:
        """The prompt ids of a chat request (the generation prompt included)."""
        if self.tokenizer is None:
            parts = []
            for m in messages:
                content = m.get("content")
                parts.append(f"<{m.get('role')}>{content if type(content) is str else text_of(content)}\n")
            parts.append("<assistant>")
            return list("".join(parts).encode())
        text = self.tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=False
        )
        return self.tokenizer.encode(text, add_special_tokens=False)

    def chat_logprobs(self, ids: list[int]) -> ChatLogprobs:
        """The chat ``logprobs`` of ``ids``, its list spliced as JSON from cached entries."""
        cache = self._chat_entries
        try:
            entries = [cache[t] for t in ids]
        except KeyError:
            entries = [self._chat_entry(t) for t in ids]
        return ChatLogprobs(content=msgspec.Raw(b"[" + b",".join(entries) + b"]"))

    def _chat_entry(self, token_id: int) -> bytes:
        entry = self._chat_entries.get(token_id)
        if entry is None:
            entry = _json_encode(token_logprob(self.token_text(token_id), logprob_of(token_id)))
            self._chat_entries[token_id] = entry
        return entry

    def completion_logprobs(self, ids: list[int]) -> CompletionLogprobs:
        tokens = [self.token_text(t) for t in ids]
        lps = [logprob_of(t) for t in ids]
        return completion_logprobs(tokens, lps, [{tok: lp} for tok, lp in zip(tokens, lps, strict=True)])


def text_of(content: Any) -> str:
    """The text of a message content: a string, or the text blocks of a list."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict))
    return str(content)
