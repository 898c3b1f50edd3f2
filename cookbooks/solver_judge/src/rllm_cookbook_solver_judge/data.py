"""Arithmetic word problems for the solver-judge loop: a generated sample (offline default) or
GSM8K from the hub (``load_tasks("hub:train" | "hub:test")``, needs ``datasets``)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from rllm.sdk.cookbook import sample_rows
from rllm.sdk.hub import hub_rows
from rllm.types import Task

SAMPLE_DIR = Path(__file__).parent / "sample"
SAMPLE_SIZES = {"train": 30, "test": 10}
ITEMS = ["apples", "books", "coins", "pens", "stamps", "marbles"]


def generate(split: str) -> list[dict[str, Any]]:
    """The sample's rows, deterministic per split (the shipped files are this function's output)."""
    rng = random.Random(f"solver-judge-{split}")
    rows = []
    for i in range(SAMPLE_SIZES[split]):
        item, a, b, c = rng.choice(ITEMS), rng.randint(3, 40), rng.randint(2, 9), rng.randint(1, 30)
        question = (
            f"Sam has {a} boxes of {b} {item} each and gives away {c} {item}. How many {item} are left?"
        )
        rows.append({"id": f"{split}-{i:03d}", "question": question, "answer": a * b - c})
    return rows


def _task(row: dict[str, Any]) -> Task:
    return Task(id=str(row["id"]), instruction=row["question"], ground_truth=row["answer"])


def load_tasks(split: str) -> list[Task]:
    if split in ("hub:train", "hub:test"):
        rows = hub_rows("openai/gsm8k", "main", split=split.removeprefix("hub:"))
        return [
            _task(
                {
                    "id": f"gsm8k-{i:05d}",
                    "question": r["question"],
                    "answer": r["answer"].split("####")[-1].strip(),
                }
            )
            for i, r in enumerate(rows)
        ]
    rows = sample_rows(SAMPLE_DIR, split, cookbook="solver-judge", other_splits=["hub:train", "hub:test"])
    return [_task(row) for row in rows]
