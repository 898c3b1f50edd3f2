"""Single-turn math: ask once, grade the ``\\boxed{}`` answer with math-verify."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from rllm.sdk import rollout, sampling_kwargs
from rllm.sdk.clients import async_openai
from rllm.sdk.cookbook import Cookbook, refuse_unknown_options, train_defaults
from rllm.sdk.rewards import math_reward
from rllm.sdk.rewards.math_grader import checked_format_coef
from rllm.types import AgentConfig, Episode, EvalOutput, Task
from rllm.types.errors import InputError
from rllm_cookbook_math import arith
from rllm_cookbook_math.data import generate, load_tasks

INSTRUCTIONS = "Solve the problem. Put the final answer in \\boxed{}."


@rollout
async def math_flow(task: Task, config: AgentConfig) -> dict:
    messages = [{"role": "user", "content": f"{task.instruction}\n{INSTRUCTIONS}"}]
    async with async_openai(config) as client:
        reply = await client.chat.completions.create(
            model=config.model, messages=messages, **{"max_tokens": 1024, **sampling_kwargs(config)}
        )
    return {"answer": reply.choices[0].message.content or ""}


class MathEvaluator:
    """math-verify's grade of the reply (``digits_joined``: the boxed digits joined first,
    ``\\boxed{7 2}`` is 72, the arith tasks' worked form). ``format_coef`` (the cookbook option
    ``format_coef``, 0 by default) is taken off the reward of a reply without a ``\\boxed{}``:
    the grade also reads an unboxed final number, so RL is otherwise free to drop the box."""

    def __init__(self, format_coef: float = 0.0, digits_joined: bool = False) -> None:
        self.format_coef, self.digits_joined = format_coef, digits_joined

    def evaluate(self, task: Task, episode: Episode) -> EvalOutput:
        answer = str(episode.artifacts.get("answer", ""))
        if self.digits_joined:
            return arith.arith_reward(answer, str(task.ground_truth), self.format_coef)
        return math_reward(answer, str(task.ground_truth), self.format_coef)

    __call__ = evaluate  # callable like the @evaluator function it replaces


OPTIONS = ("format_coef",)
ARITH_OPTIONS = (*OPTIONS, "notation")  # notation: arith.NOTATIONS, how the problems are written


def _format_coef(options: dict[str, Any], known: tuple[str, ...] = OPTIONS) -> float:
    refuse_unknown_options("math", options, known)
    return checked_format_coef(options.get("format_coef", 0.0))


def _configured(base: Cookbook, options: dict[str, Any], known: tuple[str, ...] = OPTIONS) -> Cookbook:
    """``base`` with its evaluator set up from ``cookbook_options`` (``rllm eval --option``)."""
    evaluator = base.evaluator
    evaluator = MathEvaluator(_format_coef(options, known), evaluator.digits_joined)
    return dataclasses.replace(base, evaluator=evaluator)


def _configure_math(options: dict[str, Any]) -> Cookbook:
    return _configured(cookbook, options)


def _configure_arith(options: dict[str, Any]) -> Cookbook:
    """``format_coef`` as for ``math``; ``notation`` (``spaced``, the default, or ``plain``: ``What
    is 47 + 25?`` for a real model's tokenizer) rewrites every split and level's problems."""
    configured = _configured(arith_cookbook, options, ARITH_OPTIONS)
    notation = options.get("notation", "spaced")
    if notation not in arith.NOTATIONS:
        raise InputError(f"notation must be one of {list(arith.NOTATIONS)}, got {notation!r}")
    if notation == "spaced":
        return configured
    return dataclasses.replace(
        configured,
        load_tasks=functools.partial(arith.load_tasks, notation=notation),
        levels=arith.ArithLevels(notation),
    )


math_evaluator = MathEvaluator()
arith_evaluator = MathEvaluator(digits_joined=True)


TRAIN_DEFAULTS = train_defaults(estimator="grpo")

cookbook = Cookbook(
    name="math",
    flow=math_flow,
    evaluator=math_evaluator,
    load_tasks=load_tasks,
    description="Single-turn math; reward 1 when the final (\\boxed{}) answer is equivalent (math-verify).",
    train_defaults=TRAIN_DEFAULTS,
    configure=_configure_math,
)

# The worked solutions are ~30 tokens; 64 leaves room without letting an untrained model ramble.
# Groups of 16 (8 tasks a step, the same 128 rollouts) leave fewer groups all-right or all-wrong.
ARITH_TRAIN_DEFAULTS = train_defaults(estimator="grpo", max_tokens=64, group_size=16, tasks_per_step=8)

arith_cookbook = Cookbook(
    name="math-arith",
    flow=math_flow,
    evaluator=arith_evaluator,
    load_tasks=arith.load_tasks,
    description="Two-digit addition/subtraction, generated; \\boxed{} answers (math-verify); SFT set from rllm_cookbook_math.arith.",
    train_defaults=ARITH_TRAIN_DEFAULTS,
    # One-, two- and three-digit operands: rollout.curriculum.promote moves a run up as it learns.
    levels=arith.LEVELS,
    configure=_configure_arith,
)

__all__ = [
    "MathEvaluator",
    "arith_cookbook",
    "cookbook",
    "generate",
    "load_tasks",
    "math_evaluator",
    "math_flow",
]
