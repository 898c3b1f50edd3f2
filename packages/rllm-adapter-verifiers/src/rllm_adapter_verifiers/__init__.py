"""verifiers environments as rLLM cookbooks: ``rllm train verifiers:NAME``.

NAME is a verifiers environment: an installed environment package's module (``vf-gsm8k`` ->
``vf_gsm8k``) or any importable module with ``load_environment(**args)``; cookbook options are
its arguments. The flow runs the environment's own rollout (``Environment.run_rollout``: its
prompt, its turns — single-turn, multi-turn ``env_response``, tool calls offered as native tools —
and its rubric's score) with a verifiers client over the rollout's session, so every model call
goes through rLLM's gateway and is recorded with its token ids. The evaluator reads the
rubric's reward (correct at ``pass_threshold``) and reports its metrics as signals.

A failure verifiers attributes to the model endpoint or the environment's infrastructure
(``ModelError``, ``InfraError``, sandbox and tunnel errors) is an rLLM ``InfraError`` (retried,
never scored); a model reply the environment could not use (an invalid response, a bad tool
call) is the agent's and keeps the rubric's score.
"""

from __future__ import annotations

import json
from typing import Any

from rllm.sdk import InfraError, rollout, sampling_kwargs
from rllm.sdk.clients import async_openai
from rllm.sdk.cookbook import Adapter, Cookbook, train_defaults
from rllm.types import AgentConfig, Episode, EvalOutput, Signal, Task
from rllm.types.errors import InputError
from rllm_adapter_verifiers import environments

# verifiers' error classes that say the model endpoint or the environment's machinery failed.
INFRA_ERRORS = frozenset({"ModelError", "InfraError", "SandboxError", "BrowserSandboxError", "TunnelError"})


@rollout
async def verifiers_flow(task: Task, config: AgentConfig) -> dict[str, Any]:
    """The environment's own rollout and scoring, its model calls through this session."""
    vf = environments.library()
    address = task.metadata["verifiers"]
    env = environments.load(address["env"], address["args"])
    async with async_openai(config) as client:
        output = await env.run_rollout(
            dict(address["input"]),
            vf.OpenAIChatCompletionsClient(client),
            config.model,
            sampling_kwargs(config),
        )
    error = output.get("error")
    if error and error.get("error") in INFRA_ERRORS:
        raise InfraError(
            f"verifiers {error['error']}: {error.get('error_chain_str') or error.get('message', '')}"
        )
    return {
        "reward": float(output.get("reward") or 0.0),
        "metrics": {
            k: float(v) for k, v in (output.get("metrics") or {}).items() if isinstance(v, int | float)
        },
        "pass_threshold": float(getattr(env, "pass_threshold", 0.5)),
        "stop_condition": output.get("stop_condition"),
        "is_truncated": bool(output.get("is_truncated")),
        "vf_error": error.get("error") if error else None,
        "is_validation": config.is_validation,
    }


class VerifiersReward:
    """The environment's rubric score (computed in the flow, where verifiers scores a rollout)."""

    async def evaluate(self, task: Task, episode: Episode) -> EvalOutput:
        artifacts = episode.artifacts
        if "reward" not in artifacts:
            raise InputError(f"episode of {task.id!r} has no verifiers reward: was it run by verifiers_flow?")
        reward = float(artifacts["reward"])
        signals = [Signal(name=f"vf/{k}", value=v) for k, v in sorted(artifacts.get("metrics", {}).items())]
        signals.append(Signal(name="vf/truncated", value=float(artifacts.get("is_truncated", False))))
        signals.append(Signal(name="vf/model_error", value=float(artifacts.get("vf_error") is not None)))
        return EvalOutput(
            reward=reward,
            is_correct=reward >= float(artifacts.get("pass_threshold", 0.5)),
            signals=signals,
        )


verifiers_reward = VerifiersReward()


def cookbook_for(name: str, options: dict[str, Any] | None = None) -> Cookbook:
    """The cookbook of environment ``name`` built with ``options`` (its ``load_environment``
    arguments); the environment is loaded here, so a missing one or bad arguments stop the run
    before anything starts."""
    environments.library()
    args_json = json.dumps(options or {}, sort_keys=True, default=str)
    env = environments.load(name, args_json)
    splits = ("train", "test") if environments.has_eval_dataset(env) else ("train",)

    def load_tasks(split: str) -> list[Task]:
        if split not in splits:
            raise InputError(f"verifiers:{name} has splits {', '.join(map(repr, splits))}, not {split!r}")
        return environments.tasks(name, args_json, split)

    defaults = train_defaults(tasks_per_step=16, group_size=8, max_tokens=1024)
    if "test" not in splits:
        defaults = {k: v for k, v in defaults.items() if k not in ("val_split", "val_every")}
    return Cookbook(
        name=f"verifiers:{name}",
        flow=verifiers_flow,
        evaluator=verifiers_reward,
        load_tasks=load_tasks,
        description=f"verifiers environment {name} ({type(env).__name__}), scored by its rubric",
        splits=splits,
        train_defaults=defaults,
        configure=lambda more: cookbook_for(name, {**(options or {}), **more}),
    )


def _names() -> list[str]:
    return ["rllm_adapter_verifiers.examples.say"]


adapter = Adapter(
    prefix="verifiers",
    package="rllm-adapter-verifiers",
    library="verifiers",
    cookbook=cookbook_for,
    names=_names,
    flows=("single-turn", "multi-turn", "tools"),
    modes=("train", "eval"),
    description="a verifiers Environment by module name (its rollout, turns, tools and rubric)",
)

__all__ = ["INFRA_ERRORS", "VerifiersReward", "adapter", "cookbook_for", "verifiers_flow", "verifiers_reward"]
