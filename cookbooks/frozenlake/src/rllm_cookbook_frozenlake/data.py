"""FrozenLake tasks: maps. A generated sample ships in the package (offline default).

There is no hub dataset for FrozenLake: ``load_tasks("gen:train")`` draws 1000 more random
solvable maps with gymnasium's own generator.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rllm.sdk.cookbook import sample_rows
from rllm.types import Task

SAMPLE_DIR = Path(__file__).parent / "sample"
SAMPLE_SIZES = {"train": 20, "test": 10}
FIXED_MAP = ["SFFF", "FHFH", "FFFH", "HFFG"]  # gymnasium's classic 4x4 map


def generate(split: str, count: int | None = None) -> list[dict[str, Any]]:
    """Random solvable 4x4 maps, deterministic per split (the shipped files are this output)."""
    from gymnasium.envs.toy_text.frozen_lake import generate_random_map

    base = {"train": 0, "test": 10_000, "gen:train": 100_000}[split]
    n = count if count is not None else SAMPLE_SIZES.get(split, 1000)
    return [
        {"id": f"{split}-{i:03d}", "map": generate_random_map(size=4, p=0.8, seed=base + i)} for i in range(n)
    ]


def instruction(desc: list[str], position: int = 0) -> str:
    """The prompt of every turn: the map's rows, how cells are named, the moves, the agent's cell.

    Compact on purpose: every word is one token of the tiny model's tokenizer (the rows are words
    of the task vocabulary), and the agent's cell is the last word, the one thing that changes
    from turn to turn. A model trained from scratch learned nothing about where it was from a
    70-token prompt whose map marked the agent with ``P`` (see benchmarks/history/issue-16.md,
    "#16, session 2")."""
    from rllm_cookbook_frozenlake.env import cell_name, observation

    last = cell_name(desc, len(desc) * len(desc[0]) - 1)
    return (
        f"map {' '.join(desc)} cells a - {last} by rows . move left down right up . "
        f"{observation(desc, position)}"
    )


def task_for_map(task_id: str, desc: list[str], max_turns: int = 8) -> Task:
    return Task(id=task_id, instruction=instruction(desc), metadata={"map": desc, "max_turns": max_turns})


def load_tasks(split: str) -> list[Task]:
    if split == "gen:train":
        rows = generate(split)
    elif split == "fixed":
        rows = [{"id": "fixed-4x4", "map": FIXED_MAP}]
    else:
        rows = sample_rows(SAMPLE_DIR, split, cookbook="frozenlake", other_splits=["fixed", "gen:train"])
    return [task_for_map(str(row["id"]), list(row["map"])) for row in rows]
