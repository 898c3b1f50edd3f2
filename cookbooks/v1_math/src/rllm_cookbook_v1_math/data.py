"""Tasks: a small shipped sample (train/test) and, for real runs, a Hugging Face hub loader."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from rllm.sdk.hub import hub_rows
from rllm.types import Task
from rllm.types.errors import InputError

TEST_SIZE = 8


def load_tasks(split: str) -> list[Task]:
    """The shipped sample: 24 generated problems (arithmetic, linear equations, fractions,
    polygon diagonals); the last 8 are the test split."""
    if split not in ("train", "test"):
        raise InputError(f"the v1-math cookbook has splits 'train' and 'test', not {split!r}")
    text = resources.files("rllm_cookbook_v1_math").joinpath("data/sample.jsonl").read_text()
    tasks = [_task(json.loads(line), f"sample.jsonl:{n}") for n, line in enumerate(text.splitlines(), 1)]
    return tasks[:-TEST_SIZE] if split == "train" else tasks[-TEST_SIZE:]


def load_hub_tasks(
    name: str = "HuggingFaceH4/MATH-500", split: str = "test", limit: int | None = None
) -> list[Task]:
    """Tasks from a hub dataset with ``problem`` and ``answer`` columns (needs the ``hub`` extra
    and network access; never used in tests)."""
    rows = hub_rows(name, split=split)
    out = []
    for i, row in enumerate(rows):
        if limit is not None and i >= limit:
            break
        out.append(_task({"id": str(row.get("unique_id", i)), **row}, f"{name}[{split}][{i}]"))
    return out


def _task(row: dict[str, Any], where: str) -> Task:
    for field in ("problem", "answer"):
        if not isinstance(row.get(field), str) or not row[field].strip():
            raise InputError(f"{where}: field {field!r} must be a non-empty string")
    return Task(id=str(row.get("id", where)), instruction=row["problem"], ground_truth=row["answer"])
