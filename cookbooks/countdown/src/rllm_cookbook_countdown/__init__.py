"""Countdown: one turn; the equation in ``<answer>`` must hit the target, numbers used at most once."""

from __future__ import annotations

from rllm.sdk import rollout, sampling_kwargs
from rllm.sdk.clients import async_openai
from rllm.sdk.cookbook import Cookbook, train_defaults
from rllm.sdk.evaluator import evaluator
from rllm.types import AgentConfig, Episode, EvalOutput, Signal, Task
from rllm_cookbook_countdown.data import generate, load_tasks
from rllm_cookbook_countdown.equation import check, extract_equation


@rollout
async def countdown_flow(task: Task, config: AgentConfig) -> dict:
    messages = [{"role": "user", "content": str(task.instruction)}]
    async with async_openai(config) as client:
        reply = await client.chat.completions.create(
            model=config.model, messages=messages, **{"max_tokens": 512, **sampling_kwargs(config)}
        )
    return {"answer": reply.choices[0].message.content or ""}


@evaluator
def countdown_evaluator(task: Task, episode: Episode) -> EvalOutput:
    reply = str(episode.artifacts.get("answer", ""))
    correct, why = check(reply, task.metadata["numbers"], task.metadata["target"])
    has_answer = extract_equation(reply) is not None
    return EvalOutput(
        reward=1.0 if correct else 0.0,
        is_correct=correct,
        signals=[Signal(name="has_answer", value=float(has_answer))],
        metadata={"why": why},
    )


TRAIN_DEFAULTS = train_defaults(max_tokens=512)

cookbook = Cookbook(
    name="countdown",
    flow=countdown_flow,
    evaluator=countdown_evaluator,
    load_tasks=load_tasks,
    description="Countdown arithmetic; reward 1 when the equation is exact and uses each number at most once.",
    train_defaults=TRAIN_DEFAULTS,
)

__all__ = ["check", "cookbook", "countdown_evaluator", "countdown_flow", "generate", "load_tasks"]
