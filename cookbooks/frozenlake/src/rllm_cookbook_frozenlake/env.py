"""gymnasium's FrozenLake as text: cells named by letters, moves parsed from replies."""

from __future__ import annotations

import re

from rllm.types.errors import InputError

ACTIONS = {"left": 0, "down": 1, "right": 2, "up": 3}  # gymnasium's FrozenLake action ids
CELL_LETTERS = "abcdefghijklmnopqrstuvwxyz"
_WORD = re.compile(r"\b(left|down|right|up)\b", re.IGNORECASE)


def make_env(desc: list[str]):
    """A deterministic (not slippery) FrozenLake on ``desc``."""
    import gymnasium as gym

    return gym.make("FrozenLake-v1", desc=desc, is_slippery=False)


def cell_name(desc: list[str], position: int) -> str:
    """The cell's name: a letter, ``a`` to ``p`` row by row on a 4x4 map (one token each in the
    tiny model's tokenizer, so the agent's position is a single token it can key its move on)."""
    cells = len(desc) * len(desc[0])
    if cells > len(CELL_LETTERS):
        raise InputError(
            f"frozenlake names cells with letters: at most {len(CELL_LETTERS)} cells, got {cells}"
        )
    return CELL_LETTERS[position]


def observation(desc: list[str], position: int) -> str:
    """Where the agent is, ``at <cell>``: the last words of each turn's prompt."""
    return f"at {cell_name(desc, position)}"


def parse_action(reply: str) -> int | None:
    """The last move word in the reply (``left``/``down``/``right``/``up``), or None."""
    found = _WORD.findall(reply)
    return ACTIONS[found[-1].lower()] if found else None
