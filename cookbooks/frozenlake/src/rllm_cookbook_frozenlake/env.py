"""gymnasium's FrozenLake as text: the map rendered with the agent's cell, moves parsed from replies."""

from __future__ import annotations

import re

ACTIONS = {"left": 0, "down": 1, "right": 2, "up": 3}  # gymnasium's FrozenLake action ids
_WORD = re.compile(r"\b(left|down|right|up)\b", re.IGNORECASE)


def make_env(desc: list[str]):
    """A deterministic (not slippery) FrozenLake on ``desc``."""
    import gymnasium as gym

    return gym.make("FrozenLake-v1", desc=desc, is_slippery=False)


def render(desc: list[str], position: int) -> str:
    """The map, cells space-separated, the agent's cell shown as ``P``."""
    width = len(desc[0])
    rows = []
    for r, row in enumerate(desc):
        cells = ["P" if r * width + c == position else ch for c, ch in enumerate(row)]
        rows.append(" ".join(cells))
    return "\n".join(rows)


def parse_action(reply: str) -> int | None:
    """The last move word in the reply (``left``/``down``/``right``/``up``), or None."""
    found = _WORD.findall(reply)
    return ACTIONS[found[-1].lower()] if found else None
