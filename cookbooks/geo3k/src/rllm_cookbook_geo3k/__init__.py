"""Geo3K: a vision-language agent reads a geometry diagram and answers in ``\\boxed{}``.

One chat turn whose user message is a text block (the question) and an ``image_url`` block (the
diagram as a base64 PNG data URI, built and checked by ``rllm.sdk.images.image_block``); the
evaluator grades the boxed answer with math-verify.
"""

from __future__ import annotations

from rllm.sdk import rollout, sampling_kwargs
from rllm.sdk.clients import async_openai
from rllm.sdk.cookbook import Cookbook, train_defaults
from rllm.sdk.evaluator import evaluator
from rllm.sdk.images import image_block
from rllm.sdk.rewards import math_reward
from rllm.types import AgentConfig, Episode, EvalOutput, Task
from rllm_cookbook_geo3k.data import generate, load_tasks

INSTRUCTIONS = "Look at the diagram and solve the problem. Put the final answer in \\boxed{}."


def geo3k_messages(task: Task) -> list[dict]:
    """The user message: the question as text, then the diagram as a data-URI image block (a bad
    image raises rllm.sdk.images.ImageError here, before any model call)."""
    text = task.instruction if isinstance(task.instruction, str) else ""
    content = [
        {"type": "text", "text": f"{text}\n{INSTRUCTIONS}"},
        image_block(task.metadata["image"]),
    ]
    return [{"role": "user", "content": content}]


@rollout
async def geo3k_flow(task: Task, config: AgentConfig) -> dict:
    messages = geo3k_messages(task)
    async with async_openai(config) as client:
        reply = await client.chat.completions.create(
            model=config.model, messages=messages, **{"max_tokens": 1024, **sampling_kwargs(config)}
        )
    return {"answer": reply.choices[0].message.content or ""}


@evaluator
def geo3k_evaluator(task: Task, episode: Episode) -> EvalOutput:
    return math_reward(str(episode.artifacts.get("answer", "")), str(task.ground_truth))


TRAIN_DEFAULTS = train_defaults(estimator="grpo")

cookbook = Cookbook(
    name="geo3k",
    flow=geo3k_flow,
    evaluator=geo3k_evaluator,
    load_tasks=load_tasks,
    description="Geometry diagrams (image + question); reward 1 when the \\boxed{} answer is equivalent (math-verify).",
    train_defaults=TRAIN_DEFAULTS,
)

__all__ = [
    "INSTRUCTIONS",
    "cookbook",
    "generate",
    "geo3k_evaluator",
    "geo3k_flow",
    "geo3k_messages",
    "load_tasks",
]
