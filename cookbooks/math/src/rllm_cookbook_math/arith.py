"""Two-digit addition and subtraction, generated, with worked solutions for SFT (``math-arith``).

A fresh tiny model gets no reward on ``math`` at all, so RL alone never updates it. This task is
the path a user takes instead: fine-tune on worked solutions (``write_sft_set``), then RL from that
checkpoint. The tiny model's tokenizer is word-level (a whole number is one token), so operands
and answers are written digit by digit, as digit-splitting tokenizers (Llama 3, Qwen) see them
anyway; the worked solution adds column by column and ends with the answer's digits in the box,
``\\boxed{7 2}``, each copied from the column work. :func:`arith_reward` joins the boxed digits
back into one number and grades it with math-verify.

Splits: ``train`` (2000 problems) and ``test`` (200, held out: no (a, op, b) of ``test`` appears in
``train`` or in the SFT set), deterministic.

Difficulty levels (``LEVELS``, an ``rllm.sdk.cookbook.DifficultyLevels``): operands of one digit
(level 0), two (level 1: exactly the splits above) and three (level 2). ``rllm train math-arith
rollout.curriculum.promote=0.8`` starts at level 0 and moves up as the run passes each level.

Notation (the cookbook option ``notation``): ``spaced`` (the default, for the word-level tokenizer)
or ``plain``, ``What is 47 + 25?``, as a real model's tokenizer reads numbers: the same problems,
ids and answers either way.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

from rllm.sdk.rewards import math_reward
from rllm.types import EvalOutput, Task
from rllm.types.errors import InputError

SPLIT_SIZES = {"train": 2000, "test": 200}
OPS = ("+", "-")
INSTRUCTIONS = "Solve the problem. Put the final answer in \\boxed{}."


NOTATIONS = ("spaced", "plain")


def problem_text(a: int, op: str, b: int, notation: str = "spaced") -> str:
    """``What is 4 7 + 2 5 ?`` (``spaced``: one token a digit for the word-level tokenizer) or
    ``What is 47 + 25?`` (``plain``)."""
    if notation == "plain":
        return f"What is {a} {op} {b}?"
    return f"What is {' '.join(str(a))} {op} {' '.join(str(b))} ?"


def answer(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b


def boxed_digits(n: int) -> str:
    """``72`` -> ``7 2``: the answer as the worked solution boxes it, one token per digit."""
    return " ".join(str(n))


def worked_solution(a: int, op: str, b: int) -> str:
    """Column arithmetic with a fixed shape, then the answer's digits in the box.

    ``47 + 25``: ``7 + 5 = 1 2 , 4 + 2 + 1 = 0 7 , so \\boxed{7 2}`` (units with its carry, then tens
    plus carry as two digits). ``42 - 17``: ``1 2 - 7 = 5 , 4 - 1 - 1 = 2 , so \\boxed{2 5}`` (the units
    column is written with its borrow digit in front, then tens minus borrow minus tens). Every
    boxed digit is a digit the columns already wrote (the tens result, less a leading 0, then the
    units digit), so the answer is a copy, not a new fact: the reward on it rewards the columns.
    """
    a1, a0, b1, b0 = a // 10, a % 10, b // 10, b % 10
    if op == "+":
        units = a0 + b0
        carry, u = divmod(units, 10)
        tens = a1 + b1 + carry
        steps = f"{a0} + {b0} = {carry} {u} , {a1} + {b1} + {carry} = {tens // 10} {tens % 10}"
    else:
        borrow = int(a0 < b0)
        u = 10 * borrow + a0 - b0
        tens = a1 - borrow - b1
        steps = f"{borrow} {a0} - {b0} = {u} , {a1} - {borrow} - {b1} = {tens}"
    return f"{steps} , so \\boxed{{{boxed_digits(answer(a, op, b))}}}"


# "\boxed{7 2}" as written, or "\ boxed { 7 2 }" as the word-level tokenizer decodes it.
_BOX = re.compile(r"\\\s*boxed\s*\{([^{}]*)\}")


def join_boxed_digits(text: str) -> str:
    """``\\boxed{7 2}`` -> ``\\boxed{72}``: spaced digits in a box are one number (``- 1 5`` is -15),
    never a product (math-verify reads ``\\boxed{- 1 5 0}`` as -1*5*0 = 0). Boxes are rewritten in
    the canonical form (math-verify reads ``\\ boxed { 72 }`` but not ``\\ boxed {72}``)."""

    def joined(match: re.Match[str]) -> str:
        inner = re.sub(r"(?<=\d)\s+(?=\d)", "", match.group(1).strip())
        return "\\boxed{" + re.sub(r"^-\s+(?=\d)", "-", inner) + "}"

    return _BOX.sub(joined, text)


def arith_reward(response: str, ground_truth: str, format_coef: float = 0.0) -> EvalOutput:
    """math-verify's grade of the reply with its boxed digits joined (:func:`join_boxed_digits`);
    ``format_coef`` as in :func:`rllm.sdk.rewards.math_reward`."""
    return math_reward(join_boxed_digits(response), ground_truth, format_coef)


def _all_problems() -> list[tuple[int, str, int]]:
    """Every two-digit problem; subtraction keeps a >= b (no negative answers)."""
    return [(a, op, b) for op in OPS for a in range(10, 100) for b in range(10, 100) if op == "+" or a >= b]


def _split_problems() -> dict[str, list[tuple[int, str, int]]]:
    problems = _all_problems()
    random.Random("math-arith").shuffle(problems)
    test = problems[: SPLIT_SIZES["test"]]
    rest = problems[SPLIT_SIZES["test"] :]
    return {"test": test, "train": rest[: SPLIT_SIZES["train"]], "pool": rest}


def generate(split: str, notation: str = "spaced") -> list[dict[str, Any]]:
    """The rows of ``split`` (``train`` or ``test``): id, question, answer."""
    splits = _split_problems()
    if split not in SPLIT_SIZES:
        raise InputError(f"the math-arith cookbook has splits 'train', 'test', not {split!r}")
    return [
        {
            "id": f"{split}-{i:04d}",
            "question": problem_text(a, op, b, notation),
            "answer": str(answer(a, op, b)),
        }
        for i, (a, op, b) in enumerate(splits[split])
    ]


def load_tasks(split: str, notation: str = "spaced") -> list[Task]:
    return [
        Task(id=r["id"], instruction=r["question"], ground_truth=r["answer"])
        for r in generate(split, notation)
    ]


LEVEL_DIGITS = (1, 2, 3)  # operand digits at each difficulty level; level 1 is the splits above


def _level_split(level: int) -> dict[str, list[tuple[int, str, int]]]:
    """Level ``level``'s problems (operands of ``LEVEL_DIGITS[level]`` digits, ``a >= b`` for
    subtraction), split into held-out ``test`` and ``train`` as the two-digit splits are: up to
    ``SPLIT_SIZES`` each, ``test`` a fifth of them when there are fewer."""
    digits = LEVEL_DIGITS[level]
    low, high = (0 if digits == 1 else 10 ** (digits - 1)), 10**digits - 1
    rng = random.Random(f"math-arith-level-{level}")
    wanted = SPLIT_SIZES["test"] + SPLIT_SIZES["train"]
    if (high - low + 1) ** 2 <= 4 * wanted:  # few enough to list (one digit: 155 problems)
        problems = [(a, op, b) for op in OPS for a in range(low, high + 1) for b in range(low, high + 1)]
        problems = [p for p in problems if p[1] == "+" or p[0] >= p[2]]
        rng.shuffle(problems)
    else:  # three digits: 1.2 million; draw distinct ones
        chosen: dict[tuple[int, str, int], None] = {}
        while len(chosen) < wanted:
            a, op, b = rng.randint(low, high), rng.choice(OPS), rng.randint(low, high)
            chosen[(max(a, b), op, min(a, b)) if op == "-" else (a, op, b)] = None
        problems = list(chosen)
    held_out = min(SPLIT_SIZES["test"], len(problems) // 5)
    return {"test": problems[:held_out], "train": problems[held_out : held_out + SPLIT_SIZES["train"]]}


class ArithLevels:
    """``math-arith``'s tasks by difficulty (``rllm.sdk.cookbook.DifficultyLevels``): one-, two- and
    three-digit operands, written in ``notation``. Level 1 is ``load_tasks`` itself (same ids); the
    others' ids name their level (``train-L0-0007``)."""

    def __init__(self, notation: str = "spaced") -> None:
        self.notation = notation

    def level_count(self) -> int:
        return len(LEVEL_DIGITS)

    def load_level(self, split: str, level: int) -> list[Task]:
        if split not in SPLIT_SIZES:
            raise InputError(f"the math-arith cookbook has splits 'train', 'test', not {split!r}")
        if not 0 <= level < len(LEVEL_DIGITS):
            raise InputError(f"math-arith has difficulty levels 0 to {len(LEVEL_DIGITS) - 1}, not {level}")
        if level == 1:
            return load_tasks(split, self.notation)
        return [
            Task(
                id=f"{split}-L{level}-{i:04d}",
                instruction=problem_text(a, op, b, self.notation),
                ground_truth=str(answer(a, op, b)),
            )
            for i, (a, op, b) in enumerate(_level_split(level)[split])
        ]


LEVELS = ArithLevels()


def sft_examples(count: int, seed: int = 0) -> list[dict[str, Any]]:
    """``count`` chat examples (the flow's exact prompt, the worked solution), drawn from every
    problem outside ``test``; every possible answer appears at least once, so every boxed digit
    string of the held-out split is one the set has shown."""
    pool = _split_problems()["pool"]
    rng = random.Random(f"math-arith-sft-{seed}")
    by_answer: dict[int, tuple[int, str, int]] = {}
    for problem in pool:
        by_answer.setdefault(answer(*problem), problem)
    chosen = list(by_answer.values())
    if count < len(chosen):
        raise InputError(
            f"an arith SFT set needs at least {len(chosen)} examples (one per answer), got {count}"
        )
    chosen += [rng.choice(pool) for _ in range(count - len(chosen))]
    rng.shuffle(chosen)
    return [
        {
            "messages": [
                {"role": "user", "content": f"{problem_text(*p)}\n{INSTRUCTIONS}"},
                {"role": "assistant", "content": worked_solution(*p)},
            ]
        }
        for p in chosen
    ]


def write_sft_set(path: str | Path, count: int = 4000, seed: int = 0) -> Path:
    """Write :func:`sft_examples` as OpenAI chat JSONL (what ``rllm sft`` reads)."""
    out = Path(path)
    lines = [json.dumps(example) for example in sft_examples(count, seed)]
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out
