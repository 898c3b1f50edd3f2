"""OpenEnv environments as multi-turn rLLM cookbooks: ``rllm train openenv:NAME``.

NAME is an OpenEnv environment (:mod:`rllm_adapter_openenv.environments` says which names): the
adapter's ``example``, a running server's URL, an app ``module:attr`` or an installed environment
package, served by openenv-core's own server on loopback. A task is one episode: ``reset(seed)``.
The flow plays it over openenv-core's session client: each observation is the next user message,
each reply the next action (``step``), until the environment says ``done`` or the turn limit
(``max_turns``). The rewards are the environment's, from its step results, recorded in the
episode; the evaluator sums them (the episode's return) and counts the episode correct when the
environment ended it with a positive last reward.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from rllm.sdk import rollout, sampling_kwargs
from rllm.sdk.clients import async_openai
from rllm.sdk.cookbook import Adapter, Cookbook, train_defaults
from rllm.types import AgentConfig, Episode, EvalOutput, Signal, Task, TerminationReason
from rllm.types.errors import InputError
from rllm_adapter_openenv.environments import (
    EXAMPLE_APP,
    EnvAddress,
    InvalidAction,
    UnsupportedVersion,
    render,
    resolve,
    server_url,
    to_action,
)

TEST_SEED_OFFSET = 1_000_000  # test episodes' seeds, apart from the train ones


@rollout
async def openenv_flow(task: Task, config: AgentConfig) -> Episode:
    """One episode of the task's environment: reset with its seed, then reply/step until done."""
    meta = task.metadata["openenv"]
    address = msgspec.convert(meta["address"], EnvAddress)
    max_turns = int(meta.get("max_turns", 8))
    # openenv-core's first import in a process (gradio comes with it) and starting a served app
    # take seconds: off the event loop, which other rollouts share.
    client_class, url = await asyncio.to_thread(_session, address)
    rewards: list[float] = []
    invalid, turns, done = 0, 0, False
    async with client_class(url) as env, async_openai(config) as client:
        result = await env.reset(seed=int(meta["seed"]))
        done = bool(result.done)
        messages = [{"role": "user", "content": render(result.observation)}]
        while not done and turns < max_turns:
            reply = await client.chat.completions.create(
                model=config.model, messages=messages, **{"max_tokens": 256, **sampling_kwargs(config)}
            )
            text = reply.choices[0].message.content or ""
            messages.append({"role": "assistant", "content": text})
            turns += 1
            try:
                result = await env.step(to_action(text, address))
            except InvalidAction as exc:  # the model's mistake: it reads why and tries again
                invalid += 1
                messages.append({"role": "user", "content": f"error: {exc}"})
                continue
            rewards.append(float(result.reward or 0.0))
            done = bool(result.done)
            if not done:
                messages.append({"role": "user", "content": render(result.observation)})
    return Episode(
        task_id=task.id,
        artifacts={"rewards": rewards, "done": done, "turns": turns, "invalid_actions": invalid},
        termination_reason=TerminationReason.DONE if done else TerminationReason.MAX_TURNS,
    )


def _session(address: EnvAddress) -> tuple[type[Any], str]:
    from rllm_adapter_openenv.client import OpenEnvClient

    return OpenEnvClient, server_url(address)


class OpenEnvReward:
    """The environment's rewards for the episode, summed (its return)."""

    def evaluate(self, task: Task, episode: Episode) -> EvalOutput:
        artifacts = episode.artifacts
        if "rewards" not in artifacts:
            raise InputError(f"episode of {task.id!r} has no OpenEnv rewards: was it run by openenv_flow?")
        rewards = [float(r) for r in artifacts["rewards"]]
        done = bool(artifacts.get("done"))
        return EvalOutput(
            reward=sum(rewards),
            is_correct=done and bool(rewards) and rewards[-1] > 0,
            signals=[
                Signal(name="openenv/turns", value=float(artifacts.get("turns", 0))),
                Signal(name="openenv/invalid_actions", value=float(artifacts.get("invalid_actions", 0))),
                Signal(name="openenv/done", value=float(done)),
            ],
        )


openenv_reward = OpenEnvReward()

OPTIONS = {"size": 64, "test_size": 16, "max_turns": 8}


def episode_tasks(
    address: EnvAddress, split: str, *, size: int, test_size: int, max_turns: int
) -> list[Task]:
    """``size`` (train) or ``test_size`` (test) episodes, seeds 0.. (test: from TEST_SEED_OFFSET)."""
    if split not in ("train", "test"):
        raise InputError(f"openenv:{address.name} has splits 'train' and 'test', not {split!r}")
    count, offset = (size, 0) if split == "train" else (test_size, TEST_SEED_OFFSET)
    wire = msgspec.to_builtins(address)
    return [
        Task(
            id=f"openenv-{split}-{offset + i}",
            instruction=f"an episode of the OpenEnv environment {address.name} (seed {offset + i})",
            metadata={"openenv": {"address": wire, "seed": offset + i, "max_turns": max_turns}},
        )
        for i in range(count)
    ]


def cookbook_for(name: str, options: dict[str, Any] | None = None) -> Cookbook:
    """The cookbook of environment ``name``; options ``size``, ``test_size``, ``max_turns``. The
    environment is resolved and its server asked for its schema here, so a missing environment,
    an unsupported version or a server that is down stops the run before anything starts."""
    unknown = set(options or {}) - set(OPTIONS)
    if unknown:
        raise InputError(f"openenv:{name} has options {', '.join(OPTIONS)}, not {', '.join(sorted(unknown))}")
    settings = {**OPTIONS, **{k: int(v) for k, v in (options or {}).items()}}
    address = resolve(name)

    def load_tasks(split: str) -> list[Task]:
        return episode_tasks(address, split, **settings)

    return Cookbook(
        name=f"openenv:{name}",
        flow=openenv_flow,
        evaluator=openenv_reward,
        load_tasks=load_tasks,
        description=f"OpenEnv environment {name}, multi-turn over reset/step, rewarded by its step results",
        splits=("train", "test"),
        train_defaults=train_defaults(tasks_per_step=8, group_size=4, max_tokens=256),
        configure=lambda more: cookbook_for(name, {**(options or {}), **more}),
    )


adapter = Adapter(
    prefix="openenv",
    package="rllm-adapter-openenv",
    library="openenv-core",
    cookbook=cookbook_for,
    names=lambda: ["example"],
    flows=("multi-turn",),
    modes=("train", "eval"),
    description="an OpenEnv environment (reset/step over openenv-core's server) as a multi-turn flow",
)

__all__ = [
    "EXAMPLE_APP",
    "OpenEnvReward",
    "UnsupportedVersion",
    "adapter",
    "cookbook_for",
    "openenv_flow",
    "openenv_reward",
]
