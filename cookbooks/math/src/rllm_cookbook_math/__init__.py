"""Single-turn math: ask once, grade the ``\\boxed{}`` answer with math-verify."""

from __future__ import annotations

from rllm.sdk import rollout, sampling_kwargs
from rllm.sdk.clients import async_openai
from rllm.sdk.cookbook import Cookbook, train_defaults
from rllm.sdk.evaluator import evaluator
from rllm.sdk.rewards import math_reward
from rllm.types import AgentConfig, Episode, EvalOutput, Task
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


@evaluator
def math_evaluator(task: Task, episode: Episode) -> EvalOutput:
    return math_reward(str(episode.artifacts.get("answer", "")), str(task.ground_truth))


@evaluator
def arith_evaluator(task: Task, episode: Episode) -> EvalOutput:
    """math-verify on the reply with the boxed digits joined (``\\boxed{7 2}`` is 72)."""
    return arith.arith_reward(str(episode.artifacts.get("answer", "")), str(task.ground_truth))


TRAIN_DEFAULTS = train_defaults(estimator="grpo")

cookbook = Cookbook(
    name="math",
    flow=math_flow,
    evaluator=math_evaluator,
    load_tasks=load_tasks,
    description="Single-turn math; reward 1 when the \\boxed{} answer is equivalent (math-verify).",
    train_defaults=TRAIN_DEFAULTS,
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
)

__all__ = ["arith_cookbook", "cookbook", "generate", "load_tasks", "math_evaluator", "math_flow"]
