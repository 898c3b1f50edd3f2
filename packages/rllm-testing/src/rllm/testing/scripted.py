"""Scripted test models: responders for :class:`~rllm.testing.mock_upstream.MockUpstream` that
answer a task's prompts the way a test needs (right for some, wrong for others)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rllm.testing.mock_tokens import text_of

# (the request's messages, the word asked for) -> answer this turn wrong?
WrongWhen = Callable[[list[dict[str, Any]], str], bool]


def last_text(body: dict[str, Any]) -> str:
    """The text of a chat request's last message ("" when it has none)."""
    messages = body.get("messages") or []
    return text_of(messages[-1].get("content")) if messages else ""


def say_back(wrong_when: WrongWhen | None = None) -> Callable[[dict[str, Any]], str]:
    """A model for the ``say`` task: it answers ``say: WORD`` with ``WORD``, so every turn
    scores, except the turns ``wrong_when(messages, word)`` picks, answered ``"wrong"``."""

    def respond(body: dict[str, Any]) -> str:
        word = last_text(body).rsplit(":", 1)[-1].strip()
        if wrong_when is not None and wrong_when(body.get("messages") or [], word):
            return "wrong"
        return word

    return respond


__all__ = ["WrongWhen", "last_text", "say_back"]
