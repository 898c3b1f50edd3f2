"""Fixtures for engine tests: a real MockUpstream (loopback vLLM look-alike) whose replies are
scripted by the request content, and a real GatewayServer in front of it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from rllm.gateway import GatewayConfig, GatewayServer
from rllm.testing import MockReply, MockUpstream

# Tests import helpers (sandbox_helpers.py) beside them; importlib mode does not put this folder on sys.path.
sys.path.insert(0, str(Path(__file__).parent))

JUDGE_MARKER = "You are the judge."


def scripted_reply(body: dict[str, Any]) -> str | MockReply:
    """Deterministic replies keyed on the conversation, so each flow gets the turn it expects.

    - a judge prompt -> "VERDICT: CORRECT" or "...INCORRECT" (correct if it contains "4");
    - a user turn asking to "use the calculator" -> a tool call to ``add``;
    - a tool result -> "The answer is <result>";
    - anything else -> "The answer is 4." plus the task tag, so replies differ per task.
    """
    messages = body["messages"]
    last = messages[-1]
    content = last.get("content") or ""
    if isinstance(content, list):
        content = "".join(b.get("text", "") for b in content)
    if JUDGE_MARKER in content:
        verdict = "CORRECT" if "answer is 4" in content else "INCORRECT"
        return f"Checked.\nVERDICT: {verdict}"
    if last["role"] == "tool":
        return f"The answer is {content}."
    if "use the calculator" in content:
        a, b = (int(x) for x in content.rsplit(":", 1)[1].split("+"))
        return MockReply(tool_calls=[("add", json.dumps({"a": a, "b": b}))])
    tag = content.rsplit("#", 1)[1] if "#" in content else ""
    return f"The answer is 4. [{tag}]"


@pytest.fixture
async def upstream():
    m = MockUpstream(responder=scripted_reply)
    await m.start()
    yield m
    await m.stop()


@pytest.fixture
async def gateway(upstream):
    server = GatewayServer(
        GatewayConfig(upstreams=[upstream.url], health_interval_s=0.1, auto_create_sessions=False)
    )
    await server.start()
    yield server
    await server.stop()
