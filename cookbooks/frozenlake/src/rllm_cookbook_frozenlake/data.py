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


PROMPTS = ("compact", "words")  # the cookbook option ``prompt``: how each turn is written


def instruction(desc: list[str], position: int = 0, prompt: str = "compact") -> str:
    """The prompt of every turn in style ``prompt``: ``compact`` (the default) for the tiny
    model, ``words`` (:func:`words_instruction`) for a real instruct model.

    ``compact``: the map's rows, how cells are named, the moves, the agent's cell. Every word is
    one token of the tiny model's tokenizer (the rows are words of the task vocabulary), and the
    agent's cell is the last word, the one thing that changes from turn to turn. A model trained
    from scratch learned nothing about where it was from a 70-token prompt whose map marked the
    agent with ``P`` (see benchmarks/history/issue-16.md, "#16, session 2")."""
    from rllm_cookbook_frozenlake.env import cell_name, observation

    if prompt == "words":
        return words_instruction(desc, position)
    last = cell_name(desc, len(desc) * len(desc[0]) - 1)
    return (
        f"map {' '.join(desc)} cells a - {last} by rows . move left down right up . "
        f"{observation(desc, position)}"
    )


def words_instruction(desc: list[str], position: int) -> str:
    """The game told in sentences, the grid drawn with the agent's cell marked ``P``, and the one
    move asked for: what a real instruct model reads (SmolLM2-135M wrote prose about "a map" for
    the compact prompt, naming no move in 72% of its turns)."""
    width = len(desc[0])
    row, col = divmod(position, width)
    grid = "\n".join(
        " ".join("P" if (r, c) == (row, col) else cell for c, cell in enumerate(line))
        for r, line in enumerate(desc)
    )
    return (
        f"You are playing FrozenLake on a {len(desc)}x{width} grid. S is the start, F is frozen "
        "ice (safe), H is a hole (falling in ends the game) and G is the goal. You are P.\n"
        f"{grid}\n"
        f"You are at row {row + 1}, column {col + 1} (rows count from the top). "
        "Reach G without stepping on H. Reply with exactly one move: left, down, right or up."
    )


def task_for_map(task_id: str, desc: list[str], max_turns: int = 8, prompt: str = "compact") -> Task:
    metadata: dict[str, Any] = {"map": desc, "max_turns": max_turns}
    if prompt != "compact":
        metadata["prompt"] = prompt  # the flow writes every turn in this style
    return Task(id=task_id, instruction=instruction(desc, 0, prompt), metadata=metadata)


def load_tasks(split: str, prompt: str = "compact") -> list[Task]:
    if split == "gen:train":
        rows = generate(split)
    elif split == "fixed":
        rows = [{"id": "fixed-4x4", "map": FIXED_MAP}]
    else:
        rows = sample_rows(SAMPLE_DIR, split, cookbook="frozenlake", other_splits=["fixed", "gen:train"])
    return [task_for_map(str(row["id"]), list(row["map"]), prompt=prompt) for row in rows]
