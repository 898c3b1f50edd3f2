"""The OpenEnv episode as a multi-turn flow: ``reset(seed)``, then one model call a turn until the
environment says ``done`` or the turn limit.

Two ways a model acts (the cookbook option ``actions``):

- ``tools`` (the default): the action's JSON schema is offered as one OpenAI function tool
  (``step``); each call's arguments are one action, its result (the tool message) the next
  observation. ``rllm.sdk.tool_loop`` runs the calls, so arguments that are not a JSON object, a
  tool that was not offered, a field the action lacks or a value the environment's schema refuses
  come back to the model as that call's ``error: ...`` result, and a reply without a call is
  answered with a reminder: each is the model's mistake, scored (no reward for that turn, the
  reason recorded), never retried.
- ``text``: for models without tool calling, each reply is the action (``to_action``) and each
  observation the next user message; a reply the environment refuses goes back as ``error: ...``.

The episode's artifacts hold one reward a model call (the environment's rewards for the steps
that call took; 0 for a turn it took none), which the evaluator writes onto the call's Step.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

import msgspec

from rllm.sdk import rollout, sampling_kwargs
from rllm.sdk.clients import async_openai
from rllm.sdk.sandbox import needs_sandbox, task_sandbox
from rllm.sdk.tool_loop import Toolbox, ToolError, run_tool_loop
from rllm.types import AgentConfig, Episode, Task, TerminationReason
from rllm.types.errors import InputError
from rllm_adapter_openenv.environments import (
    ACTION_TOOL,
    EnvAddress,
    InvalidAction,
    action_tool,
    render,
    server_url,
    to_action,
    tool_action,
)
from rllm_adapter_openenv.sandboxed import served_in_sandbox

ACTION_MODES = ("tools", "text")
MAX_TOKENS = 256
NO_CALL = f"error: no action: call the tool {ACTION_TOOL} with the action as its arguments"


@dataclass
class Played:
    """What an episode came to: one reward and zero or more refusals a model call."""

    turn_rewards: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    done: bool = False


@rollout
async def openenv_flow(task: Task, config: AgentConfig) -> Episode:
    """One episode of the task's environment: reset with its seed, then act until done."""
    return await _episode(task, config)


@needs_sandbox(task_sandbox)
@rollout
async def openenv_sandbox_flow(task: Task, config: AgentConfig) -> Episode:
    """``openenv_flow`` with the environment's server inside the rollout's sandbox (option
    ``sandbox``; ``rllm_adapter_openenv.sandboxed``)."""
    return await _episode(task, config)


async def _episode(task: Task, config: AgentConfig) -> Episode:
    meta = task.metadata["openenv"]
    address = msgspec.convert(meta["address"], EnvAddress)
    max_turns = int(meta.get("max_turns", 8))
    mode = meta.get("actions", "tools")
    if mode not in ACTION_MODES:
        raise InputError(
            f"task {task.id!r}: openenv actions is one of {', '.join(ACTION_MODES)}, not {mode!r}"
        )
    # openenv-core's first import in a process (gradio comes with it) and starting a served app
    # take seconds: off the event loop, which other rollouts share.
    async with contextlib.AsyncExitStack() as stack:
        if address.sandbox:
            address, path = await stack.enter_async_context(served_in_sandbox(address))
            client_class, _ = await asyncio.to_thread(_session, None)
            env = await stack.enter_async_context(client_class("http://localhost", unix_path=path))
        else:
            client_class, url = await asyncio.to_thread(_session, address)
            env = await stack.enter_async_context(client_class(url))
        client = await stack.enter_async_context(async_openai(config))
        result = await env.reset(seed=int(meta["seed"]))
        first = render(result.observation)
        if result.done:
            played = Played(done=True)
        elif mode == "text":
            played = await _text_episode(env, client, config, address, first, max_turns)
        else:
            played = await _tool_episode(env, client, config, address, first, max_turns)
    return Episode(
        task_id=task.id,
        artifacts={
            "rewards": played.turn_rewards,
            "done": played.done,
            "turns": len(played.turn_rewards),
            "invalid_actions": len(played.errors),
            "errors": played.errors,
            "actions": mode,
        },
        termination_reason=TerminationReason.DONE if played.done else TerminationReason.MAX_TURNS,
    )


def _session(address: EnvAddress | None) -> tuple[type[Any], str]:
    from rllm_adapter_openenv.client import OpenEnvClient

    return OpenEnvClient, server_url(address) if address is not None else ""


async def _text_episode(
    env: Any, client: Any, config: AgentConfig, address: EnvAddress, first: str, max_turns: int
) -> Played:
    played = Played()
    messages = [{"role": "user", "content": first}]
    while not played.done and len(played.turn_rewards) < max_turns:
        reply = await client.chat.completions.create(
            model=config.model, messages=messages, **{"max_tokens": MAX_TOKENS, **sampling_kwargs(config)}
        )
        text = reply.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": text})
        try:
            result = await env.step(to_action(text, address))
        except InvalidAction as exc:  # the model's mistake: it reads why and tries again
            played.turn_rewards.append(0.0)
            played.errors.append(str(exc))
            messages.append({"role": "user", "content": f"error: {exc}"})
            continue
        played.turn_rewards.append(float(result.reward or 0.0))
        played.done = bool(result.done)
        if not played.done:
            messages.append({"role": "user", "content": render(result.observation)})
    return played


async def _tool_episode(
    env: Any, client: Any, config: AgentConfig, address: EnvAddress, first: str, max_turns: int
) -> Played:
    played = Played()
    step_rewards: list[float] = []  # one a step the environment took, in call order

    async def step(arguments: dict[str, Any]) -> str:
        if played.done:
            raise ToolError("the episode is over: the environment ended it")
        result = await env.step(tool_action(arguments, address))
        step_rewards.append(float(result.reward or 0.0))
        played.done = bool(result.done)
        return render(result.observation)

    toolbox = Toolbox([action_tool(address)], {ACTION_TOOL: step}, model_errors=(InvalidAction,))
    loop = await run_tool_loop(
        client,
        config,
        [{"role": "user", "content": first}],
        toolbox,
        max_turns=max_turns,
        max_tokens=MAX_TOKENS,
        nudge=NO_CALL,
        until=lambda: played.done,
    )
    taken = iter(step_rewards)
    for turn in loop.turns:
        reward = 0.0
        for call in turn.calls:
            if call.refused:
                played.errors.append(call.result.removeprefix("error: "))
            else:
                reward += next(taken)
        if not turn.calls:
            played.errors.append(NO_CALL.removeprefix("error: "))
        played.turn_rewards.append(reward)
    return played
