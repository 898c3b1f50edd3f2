"""Guessing-game tasks: a range of whole numbers, the guesses allowed and a fallback secret (the
number the game uses when the picker names none), generated deterministically per split and
shipped as the offline sample."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from rllm.sdk.cookbook import sample_rows
from rllm.types import Task

SAMPLE_DIR = Path(__file__).parent / "sample"
SAMPLE_SIZES = {"train": 32, "test": 8}


def generate(split: str) -> list[dict[str, Any]]:
    """The sample's rows, deterministic per split (the shipped files are this function's output)."""
    rng = random.Random(f"guess-number-{split}")
    rows = []
    for i in range(SAMPLE_SIZES[split]):
        high = rng.randint(4, 10)
        rows.append(
            {
                "id": f"{split}-{i:03d}",
                "high": high,
                "guesses": rng.randint(2, 4),
                "fallback": rng.randint(1, high),
            }
        )
    return rows


def instruction(high: int) -> str:
    """The picker's instruction. It lists every number, so a tiny word-level model built from the
    tasks' words (``model = "tiny"``) can say each of them."""
    numbers = " ".join(str(n) for n in range(1, high + 1))
    return f"Pick a secret number, one of: {numbers}. Reply with the number only."


def task(row: dict[str, Any]) -> Task:
    high = int(row["high"])
    return Task(
        id=str(row["id"]),
        instruction=instruction(high),
        metadata={"high": high, "guesses": int(row["guesses"]), "fallback": int(row["fallback"])},
    )


def load_tasks(split: str) -> list[Task]:
    return [task(row) for row in sample_rows(SAMPLE_DIR, split, cookbook="guess-number")]
