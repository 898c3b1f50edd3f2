"""MCP stdio servers inside the rollout's real bubblewrap sandbox (``"sandbox": true``): a real
FastMCP server started in the sandbox, its tools called by a scripted loopback model through
rLLM's engine and gateway. What a tool writes lands in the sandbox, not on the host; a server
that floods stdout or never answers is the agent's outcome (scored, the reason recorded); a
server that does not come up is infrastructure, with its stderr tail."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from rllm_adapter_mcp import McpServerSpec, cookbook_for, mcp_answer_reward, mcp_sandbox_flow

from rllm.engine.rollout.rollout_config import RolloutConfig
from rllm.engine.rollout.rollout_engine import RolloutEngine
from rllm.engine.sandbox import BubblewrapBackend, SandboxProvider
from rllm.sdk.sandbox import current_sandbox
from rllm.testing import MockReply, MockUpstream
from rllm.types import Episode, EvalOutput, SamplingParams, Task, TerminationReason
from rllm.types.errors import InputError

pytestmark = [
    pytest.mark.skipif(
        shutil.which("bwrap") is None or shutil.which("prlimit") is None,
        reason="bubblewrap (bwrap) and prlimit are not installed: apt-get install bubblewrap",
    ),
    pytest.mark.timeout(300),
]

SERVER = """
import os, sys, time
if sys.argv[1:] == ["--broken"]:
    sys.exit("files server: bad config, no root folder")
from mcp.server.fastmcp import FastMCP

server = FastMCP("files")

@server.tool()
def write_note(path: str, text: str) -> str:
    "Write text to path (folders made as needed)."
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    return "written " + path

@server.tool()
def flood() -> str:
    "Floods stdout outside the protocol."
    sys.stdout.write("x" * (4 * 1024 * 1024))
    sys.stdout.flush()
    time.sleep(3600)
    return "never"

@server.tool()
def hang() -> str:
    "Never answers."
    time.sleep(3600)
    return "never"

server.run()
"""
# The test's own Python (its venv and the interpreter it links to), bound into the sandbox read-only.
BINDS = tuple(sorted({sys.prefix, sys.base_prefix, str(Path(sys.executable).resolve().parents[1])}))
# A workdir of its own, which the host does not have (and not /work, the default, under which
# this checkout may live: it would hide the venv's bind).
WORKDIR = f"/home/rllm-mcp-test-{uuid.uuid4().hex[:8]}"
SANDBOX = {"workdir": WORKDIR, "files": {"server.py": SERVER}}


def server(*extra: str, **options: Any) -> dict[str, Any]:
    # A generous start-up bound: a busy machine may take long to import mcp in each sandbox.
    return {
        "name": "files",
        "command": [f"{sys.prefix}/bin/python", "server.py", *extra],
        "sandbox": True,
        "startup_timeout_s": 240.0,
        **options,
    }


# One rollout per case, all in one engine run (each in its own sandbox): the tool the model calls
# and the server it runs on, by task id.
CASES: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "write": ("write_note", {"path": f"{WORKDIR}/notes/hello.txt", "text": "hi there"}, server()),
    "flood": ("flood", {}, server(max_message_bytes=65536)),
    "hang": ("hang", {}, server(call_timeout_s=2.0)),
    "broken": ("write_note", {"path": "a", "text": "b"}, server("--broken")),
}


def responder(body: dict[str, Any]) -> str | MockReply:
    """Calls the case's tool once (the case is named in the instruction), then answers with what
    it got back."""
    last = body["messages"][-1]
    if last["role"] == "user":
        tool, arguments, _ = CASES[str(last["content"]).split()[-1]]
        return MockReply(tool_calls=[(tool, json.dumps(arguments))])
    return str(last["content"])


class NoteInSandbox:
    """The answer's reward, plus what the sandbox holds at the written path (read there after the
    flow, by the evaluator, which runs in the rollout's sandbox)."""

    async def evaluate(self, task: Task, episode: Episode) -> EvalOutput:
        result = await current_sandbox().exec(["cat", CASES["write"][1]["path"]])
        episode.artifacts["in_sandbox"] = result.stdout if result.ok else None
        return mcp_answer_reward.evaluate(task, episode)


@pytest.fixture(scope="module")
def episodes() -> dict[str, Episode]:
    closed = [str(d) for b in BINDS for d in (Path(b), *Path(b).parents) if not d.stat().st_mode & 0o001]
    if closed:
        pytest.skip(f"the test's Python is not reachable by a sandbox uid: {closed[0]} is not o+x")
    tasks = [
        Task(
            id=case,
            instruction=f"use the tool: {case}",
            ground_truth="x",
            metadata={"mcp_servers": [spec], "sandbox": SANDBOX},
        )
        for case, (_, _, spec) in CASES.items()
    ]
    config = RolloutConfig(
        n=1, concurrency=2, progress=False, max_retries=1, sampling=SamplingParams(max_tokens=200)
    )

    async def run() -> list[Episode]:
        provider = SandboxProvider(BubblewrapBackend(ro_binds=BINDS))
        async with (
            MockUpstream(responder=responder) as upstream,
            RolloutEngine(
                mcp_sandbox_flow, NoteInSandbox(), config, upstreams=[upstream.url], sandboxes=provider
            ) as engine,
        ):
            return await engine.run(tasks)

    return {episode.task_id: episode for episode in asyncio.run(run())}


def test_a_tool_writes_inside_the_sandbox_not_on_the_host(episodes: dict[str, Episode]) -> None:
    episode = episodes["write"]
    assert episode.termination_reason == TerminationReason.DONE, episode.error
    assert episode.artifacts["answer"] == f"written {WORKDIR}/notes/hello.txt"
    assert episode.artifacts["in_sandbox"] == "hi there"
    assert not Path(WORKDIR).exists()


def test_a_server_flooding_stdout_is_cut_off_as_the_agents_failure(episodes: dict[str, Episode]) -> None:
    episode = episodes["flood"]
    assert episode.termination_reason == TerminationReason.AGENT_ERROR, episode.error
    message = episode.error.message if episode.error else ""
    assert "MCP server 'files' in the sandbox failed during tools/call flood" in message
    assert "over max_message_bytes=65536" in message
    assert episode.metrics["reward"] == 0.0 and episode.metrics["attempts"] == 1.0  # scored, not retried


def test_a_server_that_never_answers_is_the_agents_failure(episodes: dict[str, Episode]) -> None:
    episode = episodes["hang"]
    assert episode.termination_reason == TerminationReason.AGENT_ERROR, episode.error
    message = episode.error.message if episode.error else ""
    assert "failed during tools/call hang" in message and "Timed out" in message
    assert episode.metrics["attempts"] == 1.0


def test_a_server_that_does_not_come_up_is_infrastructure_with_its_stderr(
    episodes: dict[str, Episode],
) -> None:
    episode = episodes["broken"]
    assert episode.termination_reason == TerminationReason.INFRA_ERROR, episode.error
    message = episode.error.message if episode.error else ""
    assert "MCP server 'files' in the sandbox failed to start" in message
    assert "bad config, no root folder" in message
    assert episode.metrics["attempts"] == 2.0  # retried as infrastructure


def test_sandboxed_specs_are_checked_and_pick_the_sandboxed_flow(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="needs a command, not a url"):
        McpServerSpec(name="s", url="http://127.0.0.1:1/mcp", sandbox=True)
    with pytest.raises(InputError, match="max_message_bytes"):
        McpServerSpec(name="s", command=["x"], sandbox=True, max_message_bytes=10)
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps({"instruction": "x", "mcp_servers": [server()], "sandbox": SANDBOX}) + "\n")
    book = cookbook_for(str(path))
    assert book.flow is mcp_sandbox_flow
    (task,) = book.load_tasks("train")
    assert task.metadata["sandbox"] == SANDBOX
    path.write_text(
        json.dumps({"instruction": "x", "mcp_servers": [server()], "sandbox": {"workdir": "rel"}}) + "\n"
    )
    with pytest.raises(InputError, match=r"line 1: .*sandbox"):
        cookbook_for(str(path))
