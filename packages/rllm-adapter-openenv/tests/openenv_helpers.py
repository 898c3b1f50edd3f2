"""What the OpenEnv adapter's tests share: scripted loopback players of guess the number (by
text or by native tool calls) and a run of the real engine and gateway against one."""

from __future__ import annotations

import itertools
import json
from typing import Any

from rllm_adapter_openenv import openenv_flow, openenv_reward

from rllm.engine.rollout.rollout_config import RolloutConfig
from rllm.engine.rollout.rollout_engine import RolloutEngine
from rllm.testing import MockReply, MockUpstream
from rllm.types import Episode, SamplingParams, Task


def bisecting(first: str | None = None):
    """A player that halves 1..8 on the environment's "higher"/"lower" (after ``first``, if any)."""

    def responder(body: dict[str, Any]) -> str:
        messages = body["messages"]
        if first is not None and len(messages) == 1:
            return first
        low, high = 1, 8
        for said, heard in zip(messages[1::2], messages[2::2], strict=False):
            if said["role"] == "assistant" and said["content"].isdigit():
                low, high = narrowed(low, high, int(said["content"]), heard["content"])
        return str((low + high) // 2)

    return responder


def narrowed(low: int, high: int, guess: int, heard: str) -> tuple[int, int]:
    if heard.startswith("higher"):
        return guess + 1, high
    if heard.startswith("lower"):
        return low, guess - 1
    return low, high


def calling(arguments: Any) -> MockReply:
    """A reply that calls the action tool ``step`` with ``arguments`` (a JSON text as is)."""
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return MockReply(tool_calls=[("step", text)])


def bisecting_tools(*first: MockReply | str):
    """The bisecting player through native tool calls: it reads each call's result (the tool
    message) and calls ``step`` with the middle of what is left; ``first``: its opening replies."""

    def responder(body: dict[str, Any]) -> MockReply | str:
        messages = body["messages"]
        asked = sum(m["role"] == "assistant" for m in messages)
        if asked < len(first):
            return first[asked]
        low, high = 1, 8
        for said, heard in itertools.pairwise(messages):
            for call in said.get("tool_calls") or []:
                try:
                    guess = json.loads(call["function"]["arguments"])["guess"]
                except (ValueError, KeyError, TypeError):
                    continue
                if isinstance(guess, int) and heard["role"] == "tool":
                    low, high = narrowed(low, high, guess, heard["content"])
        return calling({"guess": (low + high) // 2})

    return responder


async def run(tasks: list[Task], responder) -> list[Episode]:
    config = RolloutConfig(
        n=1, concurrency=4, progress=False, max_retries=0, sampling=SamplingParams(max_tokens=512)
    )
    async with (
        MockUpstream(responder=responder) as server,
        RolloutEngine(openenv_flow, openenv_reward, config, upstreams=[server.url]) as engine,
    ):
        return await engine.run(tasks)
