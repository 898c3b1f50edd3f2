"""'say: WORD' rewarded by an LLM judge: the smallest task that trains end to end on a judge's reward.

The agent is asked ``say: WORD``; a judge model scores its reply against a rubric ("starts with
WORD"). By default the judge is a group judge (RULER-style, ``rllm.sdk.rewards.GroupJudge``):
the group's replies go to the judge in one prompt and are scored relative to each other;
``judge_mode=pointwise`` scores each reply alone (``RubricJudge``). The judge's reward is
combined with a programmatic check of the first word (``CombinedReward``; weight 0 by default, so
it is reported as ``signal/reward/word`` without counting). The judge is any OpenAI-compatible
endpoint, given as cookbook options (or ``RLLM_JUDGE_BASE_URL`` / ``RLLM_JUDGE_MODEL``) and
checked before training starts.
"""

from __future__ import annotations

import dataclasses
import os
import random
from typing import Any

from rllm.sdk import rollout, sampling_kwargs
from rllm.sdk.clients import async_openai
from rllm.sdk.cookbook import Cookbook, train_defaults
from rllm.sdk.evaluator import evaluator
from rllm.sdk.rewards import (
    CombinedReward,
    GroupGather,
    GroupJudge,
    JudgeEndpoint,
    JudgeUnavailable,
    RubricJudge,
    mark_judge_failure,
)
from rllm.types import AgentConfig, ConfigError, Episode, EvalOutput, Task
from rllm.types.errors import InputError

WORDS = ("apple", "river", "stone", "cloud", "tiger", "lemon", "piano", "rocket")
RUBRIC = "The reply must start with the word the task asks for (the word after 'say:'). Nothing else counts."
GROUP_SIZE = 4
OPTIONS = {
    "judge_base_url": "the judge's OpenAI-compatible /v1 URL (or RLLM_JUDGE_BASE_URL)",
    "judge_model": "the judge's model name (or RLLM_JUDGE_MODEL)",
    "judge_api_key_env": "the variable holding the judge's API key",
    "judge_mode": "group (RULER-style, default) or pointwise",
    "judge_group_size": "the run's group_size (group mode)",
    "judge_gather_timeout_s": "how long a group waits for its last member",
    "judge_max_concurrency": "judge requests in flight at once",
    "judge_cache": "a SQLite file caching the judge's replies",
    "judge_check": "ask the endpoint for its models before starting (default true)",
    "judge_weight": "the judge's weight in the reward (default 1)",
    "word_weight": "the first-word check's weight in the reward (default 0)",
}


def load_tasks(split: str) -> list[Task]:
    """Every word for train; a fixed sample of 4 for test."""
    if split not in ("train", "test"):
        raise InputError(f"the judge-say cookbook has splits 'train' and 'test', not {split!r}")
    tasks = [Task(id=word, instruction=f"say: {word}", ground_truth=word) for word in WORDS]
    return random.Random(7).sample(tasks, 4) if split == "test" else tasks


@rollout
async def judge_say_flow(task: Task, config: AgentConfig) -> dict[str, Any]:
    async with async_openai(config) as client:
        reply = await client.chat.completions.create(
            model=config.model,
            messages=[{"role": "user", "content": str(task.instruction)}],
            **{"max_tokens": 4, **sampling_kwargs(config)},
        )
    # is_validation: a group judge scores validation replies alone (validation runs one per task).
    return {"answer": reply.choices[0].message.content or "", "is_validation": config.is_validation}


@evaluator
def first_word(task: Task, episode: Episode) -> bool:
    words = str(episode.artifacts.get("answer", "")).split()
    return bool(words) and words[0] == task.ground_truth


class MissingJudge:
    """The evaluator before a judge is configured: every episode an infra error saying so."""

    async def evaluate(self, task: Task, episode: Episode) -> EvalOutput:
        return mark_judge_failure(
            episode,
            JudgeUnavailable(
                "judge-say has no judge endpoint: pass --option judge_base_url=URL --option judge_model=NAME "
                "(cookbook_options.* in training) or set RLLM_JUDGE_BASE_URL and RLLM_JUDGE_MODEL"
            ),
        )


def evaluator_from_options(options: dict[str, Any]) -> Any:
    """The combined judge + first-word evaluator for a run's ``cookbook_options``; the endpoint
    is asked for its models first (``judge_check``), so a judge that is down stops the run here."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ConfigError(f"unknown judge-say option(s) {unknown}; known: {sorted(OPTIONS)}")
    url = options.get("judge_base_url") or os.environ.get("RLLM_JUDGE_BASE_URL")
    model = options.get("judge_model") or os.environ.get("RLLM_JUDGE_MODEL")
    if not url or not model:
        raise ConfigError(
            "judge-say needs a judge: cookbook_options.judge_base_url=URL and cookbook_options.judge_model=NAME "
            "(or RLLM_JUDGE_BASE_URL and RLLM_JUDGE_MODEL)"
        )
    endpoint = JudgeEndpoint(
        str(url),
        str(model),
        api_key_env=options.get("judge_api_key_env"),
        max_concurrency=int(options.get("judge_max_concurrency", 8)),
        max_tokens=64,
        cache=options.get("judge_cache"),
    )
    if options.get("judge_check", True):
        try:
            endpoint.check()
        except JudgeUnavailable as exc:
            raise ConfigError(f"judge-say's judge: {exc}") from None
    mode = options.get("judge_mode", "group")
    if mode == "group":
        judge: Any = GroupGather(
            GroupJudge(endpoint, RUBRIC, correct_at=1.0),
            int(options.get("judge_group_size", GROUP_SIZE)),
            gather_timeout_s=float(options.get("judge_gather_timeout_s", 240.0)),
        )
    elif mode == "pointwise":
        judge = RubricJudge(endpoint, RUBRIC, correct_at=1.0)
    else:
        raise ConfigError(f"judge-say option judge_mode must be 'group' or 'pointwise', got {mode!r}")
    weights = (float(options.get("judge_weight", 1.0)), float(options.get("word_weight", 0.0)))
    return CombinedReward(
        [("judge", judge, weights[0]), ("word", first_word, weights[1])], correct_from="word"
    )


def configure(options: dict[str, Any]) -> Cookbook:
    return dataclasses.replace(cookbook, evaluator=evaluator_from_options(options))


TRAIN_DEFAULTS = train_defaults(
    tasks_per_step=8,
    group_size=GROUP_SIZE,
    max_tokens=4,
    val_every=10,
    # Always configured (so a missing or unreachable judge is refused before anything starts);
    # keep judge_group_size equal to group_size when changing either.
    cookbook_options={"judge_group_size": GROUP_SIZE},
    # A judge failure is an infra_error episode: left out of training, never a reward of 0.
    algorithm={"mask_terminations": ["infra_error"]},
    # A group is judged once all its rollouts are in: they run in this process, all at once.
    rollout={"executor": "local", "concurrency": 32},
    backend={"options": {"model": "tiny", "learning_rate": 5e-4}},
)

cookbook = Cookbook(
    name="judge-say",
    flow=judge_say_flow,
    evaluator=MissingJudge(),
    load_tasks=load_tasks,
    description="'say: WORD' rewarded by an LLM judge (RULER-style group judge or pointwise rubric judge).",
    train_defaults=TRAIN_DEFAULTS,
    configure=configure,
)

__all__ = [
    "OPTIONS",
    "RUBRIC",
    "WORDS",
    "MissingJudge",
    "cookbook",
    "evaluator_from_options",
    "first_word",
    "judge_say_flow",
    "load_tasks",
]
