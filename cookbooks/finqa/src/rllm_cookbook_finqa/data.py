"""FinQA tasks: questions over financial tables, each task carrying its own tables.

``load_tasks("train" | "test")`` reads the sample shipped in the package: fictional companies'
statements made by :func:`generate` (the answers are computed from the tables).
``load_tasks("hub:train" | "hub:test")`` loads FinQA from the hub with ``datasets``
(:data:`HUB_DATASET`; each row's table becomes one SQLite table).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from rllm.sdk.cookbook import sample_rows
from rllm.sdk.hub import hub_rows
from rllm.types import Task

SAMPLE_DIR = Path(__file__).parent / "sample"
SAMPLE_SIZES = {"train": 24, "test": 10}
HUB_DATASET = "dreamerdeo/finqa"
COMPANIES = ["acme", "globex", "initech", "umbrella", "stark", "wayne", "hooli", "vandelay"]


def _statements(rng: random.Random, company: str) -> dict[str, dict[str, Any]]:
    revenue = [rng.randint(400, 900), 0]
    revenue[1] = revenue[0] + rng.randint(-80, 160)
    cost = [round(r * rng.uniform(0.4, 0.7)) for r in revenue]
    opex = [rng.randint(60, 150) for _ in revenue]
    net = [r - c - o for r, c, o in zip(revenue, cost, opex, strict=True)]
    income = [
        ["revenue", *revenue],
        ["cost_of_revenue", *cost],
        ["operating_expenses", *opex],
        ["net_income", *net],
    ]
    assets = [rng.randint(1000, 3000) for _ in range(2)]
    debt = [rng.randint(100, 900) for _ in range(2)]
    balance = [["total_assets", *assets], ["total_debt", *debt]]
    columns = ["item", "fy2021", "fy2022"]
    return {
        f"{company}_income_statement": {"columns": columns, "rows": income},
        f"{company}_balance_sheet": {"columns": columns, "rows": balance},
    }


def _question(rng: random.Random, company: str, tables: dict[str, dict[str, Any]]) -> tuple[str, float, str]:
    table = f"{company}_income_statement"
    rows = {r[0]: r[1:] for r in tables[table]["rows"]}
    name = company.capitalize()
    kind = rng.randrange(4)
    if kind == 0:
        return f"What was {name}'s revenue in fiscal 2022, in millions?", float(rows["revenue"][1]), table
    if kind == 1:
        change = rows["net_income"][1] - rows["net_income"][0]
        return (
            f"By how much did {name}'s net income change from fiscal 2021 to 2022, in millions?",
            float(change),
            table,
        )
    if kind == 2:
        old, new = rows["revenue"]
        pct = round((new - old) / old * 100, 2)
        return f"What was the percentage change in {name}'s revenue from fiscal 2021 to 2022?", pct, table
    revenue, cost = rows["revenue"][1], rows["cost_of_revenue"][1]
    margin = round((revenue - cost) / revenue * 100, 2)
    return f"What was {name}'s gross margin in fiscal 2022, as a percentage?", margin, table


def generate(split: str) -> list[dict[str, Any]]:
    """The sample's rows, deterministic per split (the shipped files are this function's output)."""
    rng = random.Random(f"finqa-{split}")
    rows = []
    for i in range(SAMPLE_SIZES[split]):
        company = rng.choice(COMPANIES)
        tables = _statements(rng, company)
        question, answer, table = _question(rng, company, tables)
        rows.append(
            {
                "id": f"{split}-{i:03d}",
                "question": question,
                "answer": answer,
                "table": table,
                "tables": tables,
            }
        )
    return rows


def _task(row: dict[str, Any]) -> Task:
    return Task(
        id=str(row["id"]),
        instruction=row["question"],
        ground_truth=row["answer"],
        # "table" names the table holding the answer: the evaluator's, not the agent's to see.
        metadata={"tables": row["tables"], "table": row.get("table"), "grader_only": ["table"]},
    )


def load_tasks(split: str) -> list[Task]:
    if split in ("hub:train", "hub:test"):
        return load_hub(split.removeprefix("hub:"))
    rows = sample_rows(SAMPLE_DIR, split, cookbook="finqa", other_splits=["hub:train", "hub:test"])
    return [_task(row) for row in rows]


def load_hub(split: str) -> list[Task]:
    """FinQA rows (``question``, ``answer``, ``table``: header row then data rows) as tasks."""
    tasks = []
    for i, row in enumerate(hub_rows(HUB_DATASET, split=split)):
        header, *body = row["table"]
        columns = [f"c{j}_{h}"[:40] for j, h in enumerate(header)]
        tables = {"report_table": {"columns": columns, "rows": [r[: len(columns)] for r in body]}}
        answer = row.get("answer") or row.get("exe_ans")
        tasks.append(
            _task(
                {
                    "id": f"hub-{split}-{i:05d}",
                    "question": row["question"],
                    "answer": answer,
                    "tables": tables,
                    "table": "report_table",
                }
            )
        )
    return tasks
