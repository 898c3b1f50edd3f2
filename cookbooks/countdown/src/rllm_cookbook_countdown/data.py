"""Countdown tasks: a generated sample shipped in the package (offline default) or the hub set.

``load_tasks("train" | "test")`` reads the sample (made by :func:`generate`: a random
expression over a subset of the numbers, so every task is solvable);
``load_tasks("hub:train")`` loads ``Jiayi-Pan/Countdown-Tasks-3to4`` with ``datasets``.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from rllm.sdk.cookbook import sample_rows
from rllm.sdk.hub import hub_rows
from rllm.types import Task
from rllm_cookbook_countdown.equation import evaluate

SAMPLE_DIR = Path(__file__).parent / "sample"
SAMPLE_SIZES = {"train": 40, "test": 10}
HUB_DATASET = "Jiayi-Pan/Countdown-Tasks-3to4"


def _solvable(rng: random.Random) -> tuple[list[int], int]:
    while True:
        numbers = [rng.randint(1, 25) for _ in range(rng.choice((3, 4)))]
        picked = rng.sample(numbers, rng.randint(2, len(numbers)))
        expr = str(picked[0])
        for n in picked[1:]:
            expr = f"({expr} {rng.choice('+-*')} {n})"
        value, _ = evaluate(expr)
        if 1 <= value <= 200:
            return numbers, int(value)


def generate(split: str) -> list[dict[str, Any]]:
    """The sample's rows, deterministic per split (the shipped files are this function's output)."""
    rng = random.Random(f"countdown-{split}")
    rows = []
    for i in range(SAMPLE_SIZES[split]):
        numbers, target = _solvable(rng)
        rows.append({"id": f"{split}-{i:03d}", "numbers": numbers, "target": target})
    return rows


def instruction(numbers: list[int], target: int) -> str:
    return (
        f"Using the numbers {numbers}, write an equation that equals {target}. Use + - * / and "
        "parentheses, each number at most once. Give it as <answer>equation</answer>."
    )


def _task(row: dict[str, Any]) -> Task:
    numbers, target = [int(n) for n in row["numbers"]], int(row["target"])
    return Task(
        id=str(row["id"]),
        instruction=instruction(numbers, target),
        ground_truth=target,
        metadata={"numbers": numbers, "target": target},
    )


def load_tasks(split: str) -> list[Task]:
    if split == "hub:train":
        rows = hub_rows(HUB_DATASET, split="train")
        return [
            _task({"id": f"hub-{i:06d}", "numbers": r["nums"], "target": r["target"]})
            for i, r in enumerate(rows)
        ]
    return [
        _task(row) for row in sample_rows(SAMPLE_DIR, split, cookbook="countdown", other_splits=["hub:train"])
    ]
