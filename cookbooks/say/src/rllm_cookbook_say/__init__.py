"""The 'say' toy task: an agent loop written with the plain openai client, an evaluator, data."""

from __future__ import annotations

import itertools
import random

from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam

from rllm.sdk import rollout, sampling_kwargs
from rllm.sdk.clients import async_openai
from rllm.sdk.cookbook import Cookbook
from rllm.sdk.evaluator import evaluator
from rllm.types import AgentConfig, Episode, EvalOutput, Task
from rllm.types.errors import InputError

WORDS = ("apple", "river", "stone", "cloud", "tiger", "lemon", "piano", "rocket")


def prompt_for(word: str) -> str:
    return f"say: {word}"


def load_tasks(split: str, turns: int = 2) -> list[Task]:
    """Every ordered pair (or single word) for train; a fixed shuffled sample of 16 for test."""
    if split not in ("train", "test"):
        raise InputError(f"the say cookbook has splits 'train' and 'test', not {split!r}")
    combos = list(itertools.product(WORDS, repeat=turns))
    tasks = [
        Task(
            id="-".join(words),
            instruction=prompt_for(words[0]),
            ground_truth=list(words),
            metadata={"words": list(words)},
        )
        for words in combos
    ]
    if split == "test":
        tasks = random.Random(1234).sample(tasks, min(16, len(tasks)))
    return tasks


async def _say(client: AsyncOpenAI, messages: list[ChatCompletionMessageParam], config: AgentConfig) -> str:
    sampling = {"max_tokens": 4, **sampling_kwargs(config)}
    reply = await client.chat.completions.create(model=config.model, messages=messages, **sampling)
    return reply.choices[0].message.content or ""


@rollout
async def say_flow(task: Task, config: AgentConfig) -> dict:
    """A multi-turn chat: each turn asks for the next word with the whole history kept."""
    messages: list[ChatCompletionMessageParam] = []
    replies = []
    async with async_openai(config) as client:
        for word in task.metadata["words"]:
            messages.append({"role": "user", "content": prompt_for(word)})
            text = await _say(client, messages, config)
            messages.append({"role": "assistant", "content": text})
            replies.append(text)
    return {"replies": replies}


def starts_with_word(reply: str, word: str) -> bool:
    first = reply.strip().split()
    return bool(first) and first[0] == word


@evaluator
def say_evaluator(task: Task, episode: Episode) -> EvalOutput:
    words = task.metadata["words"]
    replies = episode.artifacts.get("replies", [])
    hits = [starts_with_word(r, w) for r, w in zip(replies, words, strict=False)]
    reward = sum(hits) / len(words)
    # Each turn is credited with its own word (training uses step_credit="turn", gamma=0): the
    # earlier turns' steps carry Step.reward, the trajectory's own reward is the last turn's.
    # Scored as a whole, a wrong word was reinforced whenever the other turn was right, and one
    # word in three runs could stay wrong for good (train reward stuck near 7/8).
    per_turn = None
    if len(episode.trajectories) == 1 and len(steps := episode.trajectories[0].steps) == len(hits) > 0:
        for step, hit in zip(steps[:-1], hits, strict=False):
            step.reward = float(hit)
        per_turn = {episode.trajectories[0].role: float(hits[-1])}
    return EvalOutput(
        reward=reward, is_correct=len(hits) == len(words) and all(hits), trajectory_rewards=per_turn
    )


@rollout
async def duo_flow(task: Task, config: AgentConfig) -> dict:
    """Two roles, each its own trajectory: the speaker says the word, the repeater repeats it."""
    word = task.metadata["words"][0]
    prompt: list[ChatCompletionMessageParam] = [{"role": "user", "content": prompt_for(word)}]
    async with (
        async_openai(config, role="speaker") as speaker,
        async_openai(config, role="repeater") as repeater,
    ):
        said = await _say(speaker, prompt, config)
        repeated = await _say(repeater, prompt, config)
    return {"speaker": said, "repeater": repeated}


@evaluator
def duo_evaluator(task: Task, episode: Episode) -> EvalOutput:
    word = task.metadata["words"][0]
    speaker = float(starts_with_word(episode.artifacts.get("speaker", ""), word))
    repeater = float(starts_with_word(episode.artifacts.get("repeater", ""), word))
    return EvalOutput(
        reward=(speaker + repeater) / 2,
        is_correct=speaker == repeater == 1.0,
        trajectory_rewards={"speaker": speaker, "repeater": repeater},
    )


TRAIN_DEFAULTS = {
    "total_steps": 200,
    # Many prompts with small groups learn faster per rollout than few prompts with big groups.
    "tasks_per_step": 32,
    "group_size": 4,
    "val_split": "test",
    "val_every": 20,
    "ckpt_every": 40,
    # Two flow processes (each with its own gateway): the sampler, the trainer and the agents
    # then stop sharing one interpreter, and the time this saves pays for the 40 more steps that
    # end the main job well above 0.9 (benchmarks/history/issue-06.md, "The main job").
    "rollout": {"workers": 2, "sampling": {"temperature": 1.0, "max_tokens": 2}},
    "algorithm": {"step_credit": "turn", "gamma": 0.0},
    # Suggested settings for backends that build a tiny model (tinker's local service): a
    # randomly initialised model learns the task fastest with full fine-tuning at this rate.
    "backend": {"options": {"model": "tiny", "learning_rate": 5e-4}},
}

cookbook = Cookbook(
    name="say",
    flow=say_flow,
    evaluator=say_evaluator,
    load_tasks=load_tasks,
    description="Multi-turn 'say: WORD' game; reward = fraction of turns answered with the word.",
    train_defaults=TRAIN_DEFAULTS,
)
single_turn_cookbook = Cookbook(
    name="say-single",
    flow=say_flow,
    evaluator=say_evaluator,
    load_tasks=lambda split: load_tasks(split, turns=1),
    description="One-turn 'say: WORD'.",
    train_defaults=TRAIN_DEFAULTS,
)
duo_cookbook = Cookbook(
    name="say-duo",
    flow=duo_flow,
    evaluator=duo_evaluator,
    load_tasks=lambda split: load_tasks(split, turns=1),
    description="Two roles (speaker, repeater) saying the word; per-role rewards.",
    train_defaults={
        **TRAIN_DEFAULTS,
        "algorithm": {"estimator_by_role": {"speaker": "grpo", "repeater": "rloo"}},
    },
)

__all__ = [
    "WORDS",
    "cookbook",
    "duo_cookbook",
    "duo_evaluator",
    "duo_flow",
    "load_tasks",
    "prompt_for",
    "say_evaluator",
    "say_flow",
    "single_turn_cookbook",
    "starts_with_word",
]
