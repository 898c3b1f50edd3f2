"""A multi-turn verifiers environment: say one word, then the environment asks for a second one."""

from __future__ import annotations

from typing import Any

import verifiers as vf
from datasets import Dataset

from rllm_adapter_verifiers.examples.say import WORDS, first_word, replies


class TwoWords(vf.MultiTurnEnv):
    """Turn 1 asks for the task's word; the environment's reply asks for the next word in WORDS."""

    async def env_response(self, messages: Any, state: Any, **kwargs: Any) -> Any:
        word = state["answer"]
        follow = WORDS[(WORDS.index(word) + 1) % len(WORDS)]
        return [vf.UserMessage(content=f"say: {follow}")]


def both_words(completion: Any, answer: str, **kwargs: Any) -> float:
    follow = WORDS[(WORDS.index(answer) + 1) % len(WORDS)]
    hits = [first_word(r) == w for r, w in zip(replies(completion), (answer, follow), strict=False)]
    return sum(hits) / 2


def load_environment() -> vf.Environment:
    rows = [{"question": f"say: {word}", "answer": word} for word in WORDS]
    return TwoWords(dataset=Dataset.from_list(rows), max_turns=2, rubric=vf.Rubric(funcs=[both_words]))
