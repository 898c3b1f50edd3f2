"""The chat prompts the local sampler rendered and tokenized lately, by exactly what renders them.

A GRPO group sends one prompt ``group_size`` times, and rendering the chat template (Jinja) and
tokenizing the text are most of the sampler's Python per chat call. So the token ids are kept by
a key made of everything the render reads from the request — the messages,
``add_generation_prompt`` and the template's other arguments (``chat_template_kwargs`` and the
tools) — written with ``repr`` (dict order kept:
a template may iterate over a dict, and ``tojson`` writes keys in order; ``1``, ``1.0``, ``True``
and ``"1"`` all differ). Only values JSON can hold are cached (``json.dumps`` accepts them):
``repr`` of those is exact, while an arbitrary object a caller in process could send may repr
alike for different contents. The tokenizer and its chat template are fixed for the server's
life.

Bounded by the characters of its keys (least recently used entries go first); a prompt longer
than a tenth of the bound is not kept.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any

DEFAULT_MAX_CHARS = 4_000_000


def prompt_key(
    messages: list[dict[str, Any]], add_generation_prompt: bool, template_kwargs: dict[str, Any]
) -> str | None:
    """The cache key of a chat render (the request's tools are among ``template_kwargs``), or
    None when the inputs are not plain JSON values."""
    inputs = (messages, add_generation_prompt, template_kwargs)
    try:
        json.dumps(inputs)  # raises on anything JSON cannot hold (then repr need not be exact)
    except (TypeError, ValueError, RecursionError):
        return None
    return repr(inputs)


class PromptCache:
    """Thread-safe: the server's HTTP loop and an in-process gateway's loop both use it."""

    def __init__(self, max_chars: int = DEFAULT_MAX_CHARS) -> None:
        self.max_chars = max_chars
        self.hits = 0  # observability (tests, benchmarks)
        self.misses = 0
        self._entries: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()

    def get(self, key: str) -> list[int] | None:
        """The token ids rendered for ``key`` (a fresh list: callers keep it), or None."""
        with self._lock:
            ids = self._entries.get(key)
            if ids is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
        return list(ids)

    def put(self, key: str, ids: list[int]) -> None:
        if len(key) * 10 > self.max_chars:
            return
        with self._lock:
            if key in self._entries:
                return
            self._entries[key] = tuple(ids)
            self._chars += len(key)
            while self._chars > self.max_chars:
                old, _ = self._entries.popitem(last=False)
                self._chars -= len(old)

    def __len__(self) -> int:
        return len(self._entries)
