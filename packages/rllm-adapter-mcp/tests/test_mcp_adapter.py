"""The MCP adapter against the real `mcp` library: a FastMCP server over stdio and over
streamable HTTP, its tools offered to a scripted loopback model (rllm.testing's MockUpstream) as
native tool calls through rLLM's engine and gateway; a tool error read by the model; a server that
fails to start or dies mid-rollout an infra error with its stderr tail; bad task files refused."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from rllm_adapter_mcp import EXAMPLE_SERVER, cookbook_for, mcp_answer_reward, mcp_flow

from rllm.cli.main import cli
from rllm.engine.rollout.rollout_config import RolloutConfig
from rllm.engine.rollout.rollout_engine import RolloutEngine
from rllm.testing import MockReply, MockUpstream
from rllm.types import Episode, SamplingParams, Task, TerminationReason


def scripted(tool: str, arguments: dict[str, Any]):
    """Calls ``tool`` once, then says the first word of what it got back."""

    def responder(body: dict[str, Any]) -> str | MockReply:
        last = body["messages"][-1]
        if last["role"] == "user":
            return MockReply(tool_calls=[(tool, json.dumps(arguments))])
        return last["content"].split()[0] if last["content"].split() else "nothing"

    return responder


async def run(tasks: list[Task], responder) -> list[Episode]:
    config = RolloutConfig(
        n=1, concurrency=4, progress=False, max_retries=0, sampling=SamplingParams(max_tokens=200)
    )
    async with (
        MockUpstream(responder=responder) as server,
        RolloutEngine(mcp_flow, mcp_answer_reward, config, upstreams=[server.url]) as engine,
    ):
        return await engine.run(tasks)


def task(servers: list[dict[str, Any]], truth: str = "river") -> Task:
    return Task(
        id="t",
        instruction="look up k1 and say the word",
        ground_truth=truth,
        metadata={"mcp_servers": servers},
    )


async def test_a_stdio_servers_tools_are_native_tool_calls() -> None:
    (episode,) = await run(cookbook_for("example").load_tasks("test")[:1], scripted("lookup", {"key": "k1"}))
    assert episode.termination_reason == TerminationReason.DONE and episode.metrics["reward"] == 1.0
    first, second = episode.trajectories[0].steps
    assert first.output is not None and first.output.tool_calls[0].function.name == "lookup"
    assert second.input[-1].role == "tool" and second.input[-1].text == "river"  # the server's answer
    assert episode.metrics["signal/mcp/tool_calls"] == 1.0


async def test_a_tool_error_is_the_models_to_read() -> None:
    (episode,) = await run([task([EXAMPLE_SERVER])], scripted("lookup", {"key": "k9"}))
    assert episode.termination_reason == TerminationReason.DONE and episode.metrics["reward"] == 0.0
    result = episode.trajectories[0].steps[1].input[-1].text
    assert result.startswith("error:") and "no note under 'k9'" in result
    assert episode.metrics["signal/mcp/refused_calls"] == 1.0


async def test_a_streamable_http_server() -> None:
    module = "rllm_adapter_mcp.examples.notes_server"
    proc = subprocess.Popen([sys.executable, "-m", module, "--http", "0"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # printed once it listens
        assert line.startswith("ready "), line
        (episode,) = await run(
            [task([{"name": "notes", "url": line.split()[1]}])], scripted("lookup", {"key": "k1"})
        )
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert episode.termination_reason == TerminationReason.DONE and episode.metrics["reward"] == 1.0


async def test_a_server_that_fails_to_start_is_an_infra_error_with_its_stderr() -> None:
    broken = {
        "name": "broken",
        "command": ["{python}", "-c", "import sys; sys.exit('bad config: no API key')"],
    }
    (episode,) = await run([task([broken])], scripted("lookup", {"key": "k1"}))
    assert episode.termination_reason == TerminationReason.INFRA_ERROR
    message = episode.error.message if episode.error else ""
    assert "MCP server 'broken' failed to start" in message and "bad config: no API key" in message


async def test_a_server_that_dies_mid_rollout_is_an_infra_error_with_its_stderr() -> None:
    (episode,) = await run([task([EXAMPLE_SERVER])], scripted("crash", {}))
    assert episode.termination_reason == TerminationReason.INFRA_ERROR
    message = episode.error.message if episode.error else ""
    assert "MCP server 'notes' failed during tools/call crash" in message and "crash() called" in message


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([{"instruction": "x"}], "metadata.mcp_servers"),
        ([{"instruction": "x", "mcp_servers": [{"name": "a"}]}], "exactly one of command"),
        ([{"instruction": "x", "mcp_servers": [{"name": "a", "url": "u", "port": 1}]}], "unknown field"),
    ],
)
def test_a_bad_task_file_is_refused_naming_its_line(rows: list[dict], message: str, tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = CliRunner().invoke(
        cli, ["eval", f"mcp:{path}", "--split", "train", "--base-url", "http://127.0.0.1:9/v1"]
    )
    assert result.exit_code != 0 and re.search(f"line 1: .*{message}", result.output), result.output
    missing = CliRunner().invoke(
        cli, ["eval", f"mcp:{tmp_path}/none.jsonl", "--base-url", "http://127.0.0.1:9/v1"]
    )
    assert missing.exit_code != 0 and "no such task file" in missing.output


async def test_a_start_up_ended_by_the_transports_own_error_is_still_the_servers() -> None:
    """The other way a dying server ends start-up (by timing, under load): the transport's task
    group cancels initialize() and leaves only its reader's error in the group. While starting,
    that is the server's failure too (an agent_error once, at load ~7 in CI); once started, an
    error is classified as without MCP."""
    import asyncio

    import anyio
    from rllm_adapter_mcp.servers import _unwrapped

    from rllm.sdk.errors import InfraError

    def while_starting(exc: BaseException) -> BaseException | None:
        return InfraError(f"MCP server 'broken' failed to start: {type(exc).__name__}")

    with pytest.raises(InfraError, match="failed to start: ClosedResourceError"):
        async with _unwrapped(while_starting):
            raise BaseExceptionGroup("transport", [anyio.ClosedResourceError(), asyncio.CancelledError()])
    with pytest.raises(anyio.ClosedResourceError):
        async with _unwrapped():  # started: not recast
            raise BaseExceptionGroup("transport", [anyio.ClosedResourceError()])
