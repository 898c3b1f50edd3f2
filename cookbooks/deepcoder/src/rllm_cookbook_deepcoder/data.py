"""DeepCoder tasks: a generated sample of small stdin/stdout problems shipped in the package
(offline default), or the hub dataset ``agentica-org/DeepCoder-Preview-Dataset``.

``load_tasks("train" | "test")`` reads the sample; ``load_tasks("hub:<config>[:<split>]")``
(configs ``primeintellect``, ``taco``, ``lcbv5``, ``codeforces``) loads the hub with the
``datasets`` library (``pip install 'rllm-cookbook-deepcoder[hub]'``). Only stdin/stdout tests
are run; rows whose tests are all function-call style are skipped.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rllm.sdk.cookbook import sample_rows
from rllm.sdk.hub import hub_rows
from rllm.types import Task

SAMPLE_DIR = Path(__file__).parent / "sample"
SAMPLE_SIZES = {"train": 24, "test": 8}
HUB_NAME = "agentica-org/DeepCoder-Preview-Dataset"


def _sum_list(rng: random.Random) -> tuple[str, str, Callable[[str], str], Callable[[], str]]:
    statement = "The first line holds n, the second n integers. Print their sum."
    solution = "n = int(input())\nprint(sum(map(int, input().split())))\n"

    def make() -> str:
        xs = [rng.randint(-1000, 1000) for _ in range(rng.randint(1, 8))]
        return f"{len(xs)}\n{' '.join(map(str, xs))}\n"

    return statement, solution, lambda s: str(sum(map(int, s.split("\n")[1].split()))), make


def _reverse_words(rng: random.Random) -> tuple[str, str, Callable[[str], str], Callable[[], str]]:
    statement = "Read one line of words separated by single spaces. Print the words in reverse order."
    solution = "print(' '.join(reversed(input().split())))\n"
    words = ["red", "blue", "cat", "dog", "sun", "moon", "tree", "rock"]
    return (
        statement,
        solution,
        lambda s: " ".join(reversed(s.split())),
        lambda: " ".join(rng.sample(words, rng.randint(1, 6))) + "\n",
    )


def _count_vowels(rng: random.Random) -> tuple[str, str, Callable[[str], str], Callable[[], str]]:
    statement = "Read one line of lowercase letters. Print how many of them are vowels (a, e, i, o, u)."
    solution = "print(sum(c in 'aeiou' for c in input().strip()))\n"
    letters = "abcdefghijklmnopqrstuvwxyz"
    return (
        statement,
        solution,
        lambda s: str(sum(c in "aeiou" for c in s.strip())),
        lambda: "".join(rng.choice(letters) for _ in range(rng.randint(1, 30))) + "\n",
    )


def _count_primes(rng: random.Random) -> tuple[str, str, Callable[[str], str], Callable[[], str]]:
    statement = "Read an integer n (1 <= n <= 5000). Print how many primes are less than or equal to n."
    solution = "n = int(input())\nprint(sum(all(k % d for d in range(2, int(k ** 0.5) + 1)) for k in range(2, n + 1)))\n"

    def count(s: str) -> str:
        n = int(s)
        return str(sum(all(k % d for d in range(2, int(k**0.5) + 1)) for k in range(2, n + 1)))

    return statement, solution, count, lambda: f"{rng.randint(1, 5000)}\n"


def _fibonacci(rng: random.Random) -> tuple[str, str, Callable[[str], str], Callable[[], str]]:
    statement = "Read n (0 <= n <= 90). Print the n-th Fibonacci number, where F(0) = 0 and F(1) = 1."
    solution = "n = int(input())\na, b = 0, 1\nfor _ in range(n):\n    a, b = b, a + b\nprint(a)\n"

    def fib(s: str) -> str:
        a, b = 0, 1
        for _ in range(int(s)):
            a, b = b, a + b
        return str(a)

    return statement, solution, fib, lambda: f"{rng.randint(0, 90)}\n"


def _max_gap(rng: random.Random) -> tuple[str, str, Callable[[str], str], Callable[[], str]]:
    statement = (
        "The first line holds n (n >= 2), the second n integers. Print the largest value minus the smallest."
    )
    solution = "input()\nxs = list(map(int, input().split()))\nprint(max(xs) - min(xs))\n"

    def make() -> str:
        xs = [rng.randint(-50, 50) for _ in range(rng.randint(2, 9))]
        return f"{len(xs)}\n{' '.join(map(str, xs))}\n"

    def gap(s: str) -> str:
        xs = list(map(int, s.split("\n")[1].split()))
        return str(max(xs) - min(xs))

    return statement, solution, gap, make


KINDS = [_sum_list, _reverse_words, _count_vowels, _count_primes, _fibonacci, _max_gap]


def generate(split: str) -> list[dict[str, Any]]:
    """The sample's rows, deterministic per split (the shipped files are this function's output)."""
    rng = random.Random(f"deepcoder-{split}")
    rows = []
    for i in range(SAMPLE_SIZES[split]):
        statement, solution, answer, make = KINDS[rng.randrange(len(KINDS))](rng)
        inputs = [make() for _ in range(4)]
        tests = [{"input": x, "output": answer(x.rstrip("\n")) + "\n"} for x in inputs]
        rows.append({"id": f"{split}-{i:03d}", "problem": statement, "tests": tests, "reference": solution})
    return rows


def _task(row: dict[str, Any]) -> Task:
    # The tests are grader-only by name; the reference solution is marked so (rllm.types.agent_view).
    meta: dict[str, Any] = {"tests": row["tests"]}
    if "reference" in row:
        meta["reference"] = row["reference"]
        meta["grader_only"] = ["reference"]
    return Task(id=str(row["id"]), instruction=row["problem"], metadata=meta)


def load_tasks(split: str) -> list[Task]:
    if split.startswith("hub:"):
        return load_hub(split)
    rows = sample_rows(SAMPLE_DIR, split, cookbook="deepcoder", other_splits=["hub:<config>[:<split>]"])
    return [_task(row) for row in rows]


def stdin_tests(raw: Any) -> list[dict[str, str]]:
    """The stdin/stdout tests of a hub row, whichever of the dataset's layouts it uses: a JSON
    string or a list of ``{"input", "output"[, "testtype" | "type"]}``, or ``{"inputs", "outputs"}``."""
    tests = json.loads(raw) if isinstance(raw, str) else raw
    if isinstance(tests, dict) and "inputs" in tests and "outputs" in tests:
        if tests.get("fn_name"):
            return []
        tests = [{"input": i, "output": o} for i, o in zip(tests["inputs"], tests["outputs"], strict=False)]
    out = []
    for test in tests if isinstance(tests, list) else []:
        kind = str(test.get("testtype", test.get("type", "stdin")))
        if (
            "functional" in kind
            or not isinstance(test.get("input"), str)
            or not isinstance(test.get("output"), str)
        ):
            continue
        out.append({"input": test["input"], "output": test["output"]})
    return out


def load_hub(split: str) -> list[Task]:
    """``hub:<config>[:<split>]`` from the hub (needs network access and the ``hub`` extra)."""
    _, config, *rest = split.split(":")
    rows = hub_rows(HUB_NAME, config, split=rest[0] if rest else "train")
    tasks = []
    for i, row in enumerate(rows):
        tests = stdin_tests(row["tests"])
        if tests:
            tasks.append(_task({"id": f"{config}-{i}", "problem": row["problem"], "tests": tests}))
    return tasks
