"""FrozenLake, multi-turn: each turn's prompt shows the map and the agent's cell, the reply's move
is played, until the goal, a hole or the turn limit. Reward 1 at the goal; with
``step_credit="turn"`` each move is credited with the discounted outcome."""

from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import Any

from rllm.sdk import rollout, sampling_kwargs
from rllm.sdk.clients import async_openai
from rllm.sdk.cookbook import Cookbook, refuse_unknown_options, train_defaults
from rllm.sdk.evaluator import evaluator
from rllm.types import AgentConfig, Episode, EvalOutput, Signal, Task, TerminationReason
from rllm.types.errors import InputError
from rllm_cookbook_frozenlake.data import FIXED_MAP, PROMPTS, generate, instruction, load_tasks, task_for_map
from rllm_cookbook_frozenlake.env import make_env, parse_action


@rollout
async def frozenlake_flow(task: Task, config: AgentConfig) -> Episode:
    desc = task.metadata["map"]
    max_turns = int(task.metadata.get("max_turns", 8))
    env = make_env(desc)
    position, _ = env.reset(seed=0)
    moves: list[str] = []
    positions: list[int] = []  # the agent's cell after each turn
    outcome, invalid = "turn_limit", 0
    async with async_openai(config) as client:
        for _ in range(max_turns):
            # Each turn is one fresh prompt showing where the agent is now (the game is Markov):
            # the prompt's length stays fixed and the cell is the only thing that changes, which a
            # model trained from scratch keys its move on far sooner than on a growing history.
            prompt = str(task.metadata.get("prompt", "compact"))
            messages = [{"role": "user", "content": instruction(desc, int(position), prompt)}]
            reply = await client.chat.completions.create(
                model=config.model, messages=messages, **{"max_tokens": 64, **sampling_kwargs(config)}
            )
            text = reply.choices[0].message.content or ""
            action = parse_action(text)
            moves.append(text)
            if action is None:
                invalid += 1
                positions.append(int(position))
                continue
            position, reward, terminated, _, _ = env.step(action)
            positions.append(int(position))
            if terminated:
                outcome = "goal" if float(reward) > 0 else "hole"
                break
    env.close()
    return Episode(
        task_id=task.id,
        artifacts={
            "outcome": outcome,
            "turns": len(moves),
            "moves": moves,
            "invalid_moves": invalid,
            "position": int(position),
            "positions": positions,
        },
        termination_reason=TerminationReason.MAX_TURNS if outcome == "turn_limit" else TerminationReason.DONE,
    )


@evaluator
def frozenlake_evaluator(task: Task, episode: Episode) -> EvalOutput:
    success = episode.artifacts.get("outcome") == "goal"
    return EvalOutput(
        reward=1.0 if success else 0.0,
        is_correct=success,
        signals=[Signal(name="invalid_moves", value=float(episode.artifacts.get("invalid_moves", 0)))],
    )


def steps_to_goal(desc: list[str]) -> dict[int, int]:
    """Each safe cell's shortest walk to the goal (breadth-first over cells that are not holes)."""
    width, height = len(desc[0]), len(desc)
    goal = next(r * width + c for r, row in enumerate(desc) for c, ch in enumerate(row) if ch == "G")
    dist, frontier = {goal: 0}, [goal]
    while frontier:
        nxt = []
        for cell in frontier:
            r, c = divmod(cell, width)
            for rr, cc in ((r + 1, c), (r - 1, c), (r, c + 1), (r, c - 1)):
                n = rr * width + cc
                if 0 <= rr < height and 0 <= cc < width and desc[rr][cc] != "H" and n not in dist:
                    dist[n] = dist[cell] + 1
                    nxt.append(n)
        frontier = nxt
    return dist


def progress(desc: list[str], position: int) -> float:
    """The share of the shortest safe way from the start to the goal already behind ``position``.

    Shortest safe walks, not straight-line distance: a cell beside a hole that is near the goal
    as the crow flies would otherwise be a trap the policy settles in."""
    dist = steps_to_goal(desc)
    start = dist.get(0)
    if not start or position not in dist:
        return 0.0
    return max(0.0, 1.0 - dist[position] / start)


def potential(desc: list[str], position: int) -> float:
    """1 at the goal, 0 in a hole, else half the share of the way to the goal covered."""
    cell = desc[position // len(desc[0])][position % len(desc[0])]
    if cell == "G":
        return 1.0
    return 0.0 if cell == "H" else 0.5 * progress(desc, position)


@evaluator
def frozenlake_progress_evaluator(task: Task, episode: Episode) -> EvalOutput:
    """Potential-based shaping: each move earns the change of :func:`potential` it caused.

    For models that start from nothing (the benchmark's tiny model), reaching the goal by chance
    is too rare to learn from. The moves' rewards add up to the final cell's potential (the
    episode's reward: 1 at the goal); with ``step_credit="turn"`` each move is credited with its
    own and the later ones, discounted. ``is_correct`` is still reaching the goal."""
    desc = task.metadata["map"]
    positions = episode.artifacts.get("positions", [])
    values = [potential(desc, p) for p in [0, *positions]]
    gains = [b - a for a, b in itertools.pairwise(values)]
    per_turn = None
    if len(episode.trajectories) == 1 and len(steps := episode.trajectories[0].steps) == len(gains) > 0:
        for step, gain in zip(steps[:-1], gains, strict=False):
            step.reward = gain
        per_turn = {episode.trajectories[0].role: gains[-1]}
    success = episode.artifacts.get("outcome") == "goal"
    return EvalOutput(reward=values[-1], is_correct=success, trajectory_rewards=per_turn)


TRAIN_DEFAULTS = train_defaults(
    max_tokens=64,
    # The outcome arrives at the last move; each earlier move gets it discounted.
    algorithm={"step_credit": "turn", "gamma": 0.9},
)


def _configure(base: Cookbook, options: dict[str, Any]) -> Cookbook:
    """``prompt``: ``compact`` (the default, for the tiny model) or ``words`` (the game in
    sentences, for a real instruct model), for every split's tasks and every turn."""
    refuse_unknown_options("frozenlake", options, ["prompt"])
    prompt = options.get("prompt", "compact")
    if prompt not in PROMPTS:
        raise InputError(f"prompt must be one of {list(PROMPTS)}, got {prompt!r}")
    return dataclasses.replace(base, load_tasks=functools.partial(load_tasks, prompt=prompt))


cookbook = Cookbook(
    name="frozenlake",
    flow=frozenlake_flow,
    evaluator=frozenlake_evaluator,
    load_tasks=load_tasks,
    description="Multi-turn FrozenLake (gymnasium, 4x4, not slippery); reward 1 for reaching the goal.",
    train_defaults=TRAIN_DEFAULTS,
    configure=lambda options: _configure(cookbook, options),
)

progress_cookbook = Cookbook(
    name="frozenlake-progress",
    flow=frozenlake_flow,
    evaluator=frozenlake_progress_evaluator,
    load_tasks=load_tasks,
    description="FrozenLake with a progress-shaped reward (1 at the goal, partial credit short of it).",
    # Each move is credited with its own change of potential only (gamma 0): the potential is the
    # shortest safe walk, so the move that raises it is always a best move, and a move is not
    # blamed for later ones (with gamma 0.9 early moves took the blame of later mistakes).
    train_defaults={**TRAIN_DEFAULTS, "algorithm": {"step_credit": "turn", "gamma": 0.0}},
    configure=lambda options: _configure(progress_cookbook, options),
)

__all__ = [
    "FIXED_MAP",
    "cookbook",
    "frozenlake_evaluator",
    "frozenlake_flow",
    "frozenlake_progress_evaluator",
    "generate",
    "load_tasks",
    "potential",
    "progress",
    "progress_cookbook",
    "task_for_map",
]
