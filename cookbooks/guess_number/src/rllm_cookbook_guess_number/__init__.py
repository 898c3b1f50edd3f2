"""Guess the number, two players: the ``picker`` names a secret number from 1 to ``high``, then
the ``guesser`` has ``guesses`` tries, told "higher" or "lower" after each wrong one. Zero-sum:
the guesser earns more the sooner it finds the number, the picker what the guesser does not
earn. Each role is its own trajectory, so each can train its own policy (``configs/
two_policies.yaml``: self-play with separate weights); the flow never names a policy, the
gateway routes each role's calls (docs/architecture.md, "Several policies")."""

from __future__ import annotations

import re

from rllm.sdk import rollout, sampling_kwargs
from rllm.sdk.clients import async_openai
from rllm.sdk.cookbook import Cookbook, train_defaults
from rllm.sdk.evaluator import evaluator
from rllm.types import AgentConfig, Episode, EvalOutput, Task
from rllm_cookbook_guess_number.data import generate, load_tasks

PICKER_ROLE = "picker"
GUESSER_ROLE = "guesser"
_NUMBER = re.compile(r"-?[0-9]+")  # ASCII digits: int() would read "𝟏" as 1


def parse_number(reply: str, high: int) -> int | None:
    """The number ``reply`` names, when every whole number written in it is that one and it is
    from 1 to ``high``; else None. A reply with several numbers names none: read as its first,
    SmolLM2-135M learned within three RL steps to answer in both roles with a numbered list
    ("1. ..."), which read as a pick of 1 and a first guess of 1 (cookbook README)."""
    numbers = {int(found) for found in _NUMBER.findall(reply)}
    if len(numbers) != 1:
        return None
    (number,) = numbers
    return number if 1 <= number <= high else None


def hint(guess: int | None, secret: int, high: int) -> str:
    """What the guesser is told after a wrong guess."""
    if guess is None:
        return f"That is not a number from 1 to {high}. Guess again."
    return "Higher." if guess < secret else "Lower."


def guess_reward(found_at: int | None, guesses: int) -> float:
    """1 for the first guess, less for each later one, 0 when never found (in (0, 1] when found)."""
    if found_at is None:
        return 0.0
    return (guesses - found_at + 1) / guesses


@rollout
async def guess_number_flow(task: Task, config: AgentConfig) -> dict:
    high, guesses = int(task.metadata["high"]), int(task.metadata["guesses"])
    async with async_openai(config, role=PICKER_ROLE) as picker:
        reply = await picker.chat.completions.create(
            model=config.model,
            messages=[{"role": "user", "content": str(task.instruction)}],
            **{"max_tokens": 16, **sampling_kwargs(config)},
        )
    picked = parse_number(reply.choices[0].message.content or "", high)
    # A picker that names no number forfeits; the guesser still plays, for the task's fallback.
    secret = picked if picked is not None else int(task.metadata["fallback"])
    messages = [
        {
            "role": "user",
            "content": f"Guess my secret number from 1 to {high}. You have {guesses} tries. "
            "Reply with the number only.",
        }
    ]
    tried: list[int | None] = []
    async with async_openai(config, role=GUESSER_ROLE) as guesser:
        for _ in range(guesses):
            answer = await guesser.chat.completions.create(
                model=config.model, messages=messages, **{"max_tokens": 16, **sampling_kwargs(config)}
            )
            text = answer.choices[0].message.content or ""
            guess = parse_number(text, high)
            tried.append(guess)
            if guess == secret:
                break
            messages += [
                {"role": "assistant", "content": text},
                {"role": "user", "content": hint(guess, secret, high)},
            ]
    found_at = len(tried) if tried and tried[-1] == secret else None
    return {"picked": picked, "secret": secret, "guesses": tried, "found_at": found_at}


@evaluator
def guess_number_evaluator(task: Task, episode: Episode) -> EvalOutput:
    guessed = guess_reward(episode.artifacts.get("found_at"), int(task.metadata["guesses"]))
    picker = 0.0 if episode.artifacts.get("picked") is None else 1.0 - guessed
    return EvalOutput(
        reward=guessed,
        is_correct=guessed > 0,
        trajectory_rewards={PICKER_ROLE: picker, GUESSER_ROLE: guessed},
    )


TRAIN_DEFAULTS = train_defaults(group_size=4, max_tokens=16, estimator="grpo")

cookbook = Cookbook(
    name="guess-number",
    flow=guess_number_flow,
    evaluator=guess_number_evaluator,
    load_tasks=load_tasks,
    description="Guess the number: a picker and a guesser play each other (zero-sum), each role its own trajectory.",
    train_defaults=TRAIN_DEFAULTS,
)

__all__ = [
    "GUESSER_ROLE",
    "PICKER_ROLE",
    "cookbook",
    "generate",
    "guess_number_evaluator",
    "guess_number_flow",
    "guess_reward",
    "hint",
    "load_tasks",
    "parse_number",
]
