"""Math tasks: a generated sample shipped in the package (offline default) or a hub dataset.

``load_tasks("train" | "test")`` reads the sample; ``load_tasks("hub:train" | "hub:test")``
loads the hub datasets with the ``datasets`` library (``pip install 'rllm-cookbook-math[hub]'``).
"""

from __future__ import annotations

import random
from fractions import Fraction
from pathlib import Path
from typing import Any

from rllm.sdk.cookbook import sample_rows
from rllm.sdk.hub import hub_rows
from rllm.types import Task

SAMPLE_DIR = Path(__file__).parent / "sample"
SAMPLE_SIZES = {"train": 30, "test": 10}
# (dataset, config, split, question field, answer field); answers may be full solutions with \boxed{}.
HUB = {
    "hub:train": ("DigitalLearningGmbH/MATH-lighteval", "default", "train", "problem", "solution"),
    "hub:test": ("HuggingFaceH4/MATH-500", None, "test", "problem", "answer"),
}


def _problem(rng: random.Random) -> tuple[str, str]:
    kind = rng.randrange(4)
    if kind == 0:
        a, b = rng.randint(11, 99), rng.randint(11, 99)
        return f"What is {a} times {b}?", str(a * b)
    if kind == 1:
        x, a, b = rng.randint(-9, 12), rng.randint(2, 9), rng.randint(-20, 20)
        return f"Solve for x: {a}x + {b} = {a * x + b}.", str(x)
    if kind == 2:
        p, q, r, s = rng.randint(1, 9), rng.randint(2, 9), rng.randint(1, 9), rng.randint(2, 9)
        total = Fraction(p, q) + Fraction(r, s)
        answer = (
            str(total.numerator)
            if total.denominator == 1
            else f"\\frac{{{total.numerator}}}{{{total.denominator}}}"
        )
        return f"Compute {p}/{q} + {r}/{s} as a fraction in lowest terms.", answer
    n = rng.randint(2, 30)
    return f"What is the square root of {n * n}?", str(n)


def generate(split: str) -> list[dict[str, Any]]:
    """The sample's rows, deterministic per split (the shipped files are this function's output)."""
    rng = random.Random(f"math-{split}")
    rows = []
    for i in range(SAMPLE_SIZES[split]):
        question, answer = _problem(rng)
        rows.append({"id": f"{split}-{i:03d}", "question": question, "answer": answer})
    return rows


def _task(row: dict[str, Any]) -> Task:
    return Task(id=str(row["id"]), instruction=row["question"], ground_truth=row["answer"])


def load_tasks(split: str) -> list[Task]:
    if split in HUB:
        return load_hub(split)
    rows = sample_rows(SAMPLE_DIR, split, cookbook="math", other_splits=list(HUB))
    return [_task(row) for row in rows]


def load_hub(split: str) -> list[Task]:
    """The hub dataset for ``split`` (needs network access and the ``hub`` extra)."""
    from rllm.sdk.rewards import extract_boxed

    name, config, hub_split, qkey, akey = HUB[split]
    rows = hub_rows(name, config, split=hub_split)
    tasks = []
    for i, row in enumerate(rows):
        answer = str(row[akey])
        answer = extract_boxed(answer) or answer
        tasks.append(_task({"id": f"{split}-{i:05d}", "question": row[qkey], "answer": answer}))
    return tasks
