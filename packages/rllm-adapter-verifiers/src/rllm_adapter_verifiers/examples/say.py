"""A single-turn verifiers environment: ``say: WORD``, rewarded when the reply starts with WORD."""

from __future__ import annotations

from typing import Any

import verifiers as vf
from datasets import Dataset

WORDS = ("apple", "river", "stone", "cloud", "tiger", "lemon", "piano", "rocket")


def field(message: Any, name: str) -> Any:
    """A message's field, whether verifiers handed it over as a dict or as its message model."""
    return message.get(name) if isinstance(message, dict) else getattr(message, name, None)


def replies(completion: Any) -> list[str]:
    """The assistant messages' texts of a completion (a list of messages, or a string)."""
    if isinstance(completion, str):
        return [completion]
    return [str(field(m, "content") or "") for m in completion or [] if field(m, "role") == "assistant"]


def first_word(text: str) -> str:
    words = text.split()
    return words[0] if words else ""


def said_the_word(completion: Any, answer: str, **kwargs: Any) -> float:
    said = replies(completion)
    return 1.0 if said and first_word(said[-1]) == answer else 0.0


def load_environment(num_words: int = len(WORDS)) -> vf.Environment:
    rows = [{"question": f"say: {word}", "answer": word} for word in WORDS[:num_words]]
    return vf.SingleTurnEnv(
        dataset=Dataset.from_list(rows),
        eval_dataset=Dataset.from_list(rows[:2]),
        system_prompt="Reply with the word you are asked to say.",
        rubric=vf.Rubric(funcs=[said_the_word]),
    )
