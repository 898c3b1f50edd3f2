"""A tool verifiers environment: the model looks a word up with a tool, then says it."""

from __future__ import annotations

from typing import Any

import verifiers as vf
from datasets import Dataset

from rllm_adapter_verifiers.examples.say import WORDS, first_word, replies

SECRETS = {f"k{i}": word for i, word in enumerate(WORDS)}


def lookup(key: str) -> str:
    """The word stored under ``key``."""
    return SECRETS.get(key, f"no word under {key!r}")


def says_the_secret(completion: Any, answer: str, **kwargs: Any) -> float:
    said = replies(completion)
    return 1.0 if said and first_word(said[-1]) == answer else 0.0


def load_environment() -> vf.Environment:
    rows = [{"question": f"look up k{i} and say the word", "answer": w} for i, w in enumerate(WORDS)]
    return vf.ToolEnv(
        dataset=Dataset.from_list(rows),
        tools=[lookup],
        max_turns=3,
        rubric=vf.Rubric(funcs=[says_the_secret]),
    )
