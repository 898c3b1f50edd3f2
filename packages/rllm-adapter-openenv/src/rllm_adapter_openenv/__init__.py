"""OpenEnv environments as multi-turn rLLM cookbooks: ``rllm train openenv:NAME``.

NAME is an OpenEnv environment (:mod:`rllm_adapter_openenv.environments` says which names): the
adapter's ``example``, a running server's URL, an app ``module:attr`` or an installed environment
package, served by openenv-core's own server on loopback. A task is one episode: ``reset(seed)``.
The flow (:mod:`rllm_adapter_openenv.flow`) plays it over openenv-core's session client, the
model acting through a native tool call (``actions="tools"``) or its reply's text
(``actions="text"``), until the environment says ``done`` or the turn limit (``max_turns``). The
rewards are the environment's, from its step results, recorded in the episode one a model call;
the evaluator writes each onto its call's Step (for ``algorithm.step_credit=turn``), sums them
(the episode's return) and counts the episode correct when the environment ended it with a
positive last reward.
"""

from __future__ import annotations

from typing import Any

import msgspec

from rllm.sdk.cookbook import Adapter, Cookbook, train_defaults
from rllm.sdk.sandbox import task_sandbox
from rllm.types import Episode, EvalOutput, Signal, Task
from rllm.types.errors import InputError
from rllm_adapter_openenv.environments import EXAMPLE_APP, EnvAddress, UnsupportedVersion, resolve
from rllm_adapter_openenv.flow import ACTION_MODES, openenv_flow, openenv_sandbox_flow

TEST_SEED_OFFSET = 1_000_000  # test episodes' seeds, apart from the train ones


class OpenEnvReward:
    """The environment's rewards for the episode: each model call's on its Step (what turn-level
    credit reads), and their sum (the episode's return) the trajectory's reward."""

    def evaluate(self, task: Task, episode: Episode) -> EvalOutput:
        artifacts = episode.artifacts
        if "rewards" not in artifacts:
            raise InputError(f"episode of {task.id!r} has no OpenEnv rewards: was it run by openenv_flow?")
        rewards = [float(r) for r in artifacts["rewards"]]
        done = bool(artifacts.get("done"))
        steps = [step for trajectory in episode.trajectories for step in trajectory.steps]
        if len(episode.trajectories) > 1 or len(steps) != len(rewards):
            raise InputError(
                f"episode of {task.id!r} has {len(steps)} model calls in {len(episode.trajectories)} "
                f"trajectories for {len(rewards)} environment turns: openenv_flow makes one call a turn"
            )
        for step, reward in zip(steps, rewards, strict=True):
            step.reward = reward
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

OPTIONS: dict[str, Any] = {"size": 64, "test_size": 16, "max_turns": 8, "actions": "tools", "sandbox": False}


def episode_tasks(
    address: EnvAddress,
    split: str,
    *,
    size: int,
    test_size: int,
    max_turns: int,
    actions: str = "tools",
    sandbox: dict[str, Any] | None = None,
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
            metadata={
                "openenv": {"address": wire, "seed": offset + i, "max_turns": max_turns, "actions": actions},
                **({"sandbox": sandbox} if sandbox is not None else {}),
            },
        )
        for i in range(count)
    ]


def cookbook_for(name: str, options: dict[str, Any] | None = None) -> Cookbook:
    """The cookbook of environment ``name``; options ``size``, ``test_size``, ``max_turns`` and
    ``actions`` (``tools``: native tool calls; ``text``: the reply's text). The environment is
    resolved and its server asked for its schema here, so a missing environment, an unsupported
    version or a server that is down stops the run before anything starts."""
    settings = _settings(name, options or {})
    address = resolve(name, sandbox=settings["sandbox"] is not None)

    def load_tasks(split: str) -> list[Task]:
        return episode_tasks(address, split, **settings)

    return Cookbook(
        name=f"openenv:{name}",
        flow=openenv_sandbox_flow if address.sandbox else openenv_flow,
        evaluator=openenv_reward,
        load_tasks=load_tasks,
        description=f"OpenEnv environment {name}, multi-turn over reset/step, rewarded by its step results",
        splits=("train", "test"),
        train_defaults=train_defaults(tasks_per_step=8, group_size=4, max_tokens=256),
        configure=lambda more: cookbook_for(name, {**(options or {}), **more}),
    )


def _settings(name: str, options: dict[str, Any]) -> dict[str, Any]:
    unknown = set(options) - set(OPTIONS)
    if unknown:
        raise InputError(f"openenv:{name} has options {', '.join(OPTIONS)}, not {', '.join(sorted(unknown))}")
    settings = {**OPTIONS, **options}
    if settings["actions"] not in ACTION_MODES:
        raise InputError(
            f"openenv:{name} option actions is one of {', '.join(ACTION_MODES)}, not {settings['actions']!r}"
        )
    settings["sandbox"] = _sandbox_option(name, settings["sandbox"])
    for key in ("size", "test_size", "max_turns"):
        try:
            settings[key] = int(settings[key])
        except (TypeError, ValueError):
            raise InputError(
                f"openenv:{name} option {key} is a whole number, not {settings[key]!r}"
            ) from None
    return settings


def _sandbox_option(name: str, value: Any) -> dict[str, Any] | None:
    """Option ``sandbox``: false (served here), true (in a default ``SandboxSpec``) or a
    ``SandboxSpec`` as a mapping; checked now, before anything runs."""
    if value in (False, "false", None):
        return None
    spec = {} if value in (True, "true") else value
    if not isinstance(spec, dict):
        raise InputError(f"openenv:{name} option sandbox is true, false or a sandbox spec, not {value!r}")
    task_sandbox(Task(id="check", instruction="", metadata={"sandbox": spec}))
    return spec


adapter = Adapter(
    prefix="openenv",
    package="rllm-adapter-openenv",
    library="openenv-core",
    cookbook=cookbook_for,
    names=lambda: ["example"],
    flows=("multi-turn", "tools"),
    modes=("train", "eval"),
    description=(
        "an OpenEnv environment (reset/step over openenv-core's server) as a multi-turn flow, "
        "its action a native tool call (or, for models without one, the reply's text)"
    ),
)

__all__ = [
    "ACTION_MODES",
    "EXAMPLE_APP",
    "OpenEnvReward",
    "UnsupportedVersion",
    "adapter",
    "cookbook_for",
    "openenv_flow",
    "openenv_reward",
    "openenv_sandbox_flow",
]
