"""MCP servers' tools as an agent's native tool calls: ``rllm train mcp:TASKS``.

TASKS is a JSONL file of tasks (``{"id", "instruction", "ground_truth", "mcp_servers": [...]}``
a line; ``mcp_servers`` as :mod:`rllm_adapter_mcp.servers` reads it), or ``example`` (the
package's own: a notes server over stdio, look a key up and say the word). For each rollout the
flow starts (or connects to) the task's servers, offers their tools to the model through the
session (``rllm.sdk.tool_loop``: each call run on its server, the result fed back), and ends on a
reply without tool calls, whose text is the answer. The evaluator compares that answer with the
task's ground truth (normalised text); a flow of your own can use ``mcp_toolbox`` the same way.
Servers marked ``"sandbox": true`` run inside the rollout's sandbox (``mcp_sandbox_flow``, which
the cookbook picks when a task has one; the task's ``sandbox`` key is its ``SandboxSpec``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rllm.sdk import rollout
from rllm.sdk.clients import async_openai
from rllm.sdk.cookbook import Adapter, Cookbook, train_defaults
from rllm.sdk.rewards import normalized_match
from rllm.sdk.sandbox import needs_sandbox, task_sandbox
from rllm.sdk.tool_loop import run_tool_loop
from rllm.types import AgentConfig, Episode, EvalOutput, Signal, Task
from rllm.types.errors import InputError, LookupFailed
from rllm_adapter_mcp.servers import McpServerSpec, mcp_toolbox, server_specs

EXAMPLE_SERVER = {"name": "notes", "command": ["{python}", "-m", "rllm_adapter_mcp.examples.notes_server"]}
EXAMPLE_WORDS = ("apple", "river", "stone", "cloud", "tiger", "lemon")


@rollout
async def mcp_flow(task: Task, config: AgentConfig) -> dict[str, Any]:
    """The task's MCP servers' tools, offered to the model until it answers without a call."""
    return await _tool_loop(task, config)


@needs_sandbox(task_sandbox)
@rollout
async def mcp_sandbox_flow(task: Task, config: AgentConfig) -> dict[str, Any]:
    """``mcp_flow`` in a sandbox of the task's spec, where its ``"sandbox": true`` servers run."""
    return await _tool_loop(task, config)


async def _tool_loop(task: Task, config: AgentConfig) -> dict[str, Any]:
    specs = server_specs(task.metadata)
    max_turns = int(task.metadata.get("max_turns", 4))
    messages = [{"role": "user", "content": str(task.instruction)}]
    async with mcp_toolbox(specs) as toolbox, async_openai(config) as client:
        result = await run_tool_loop(
            client,
            config,
            messages,
            toolbox,
            max_turns=max_turns,
            max_tokens=256,
            final_answer=lambda text: text.strip() or None,
        )
    return {"answer": result.answer, "tool_calls": result.tool_calls, "refused": result.refused}


class McpAnswerReward:
    """1 when the answer matches the ground truth (normalised text), else 0."""

    def evaluate(self, task: Task, episode: Episode) -> EvalOutput:
        answer = episode.artifacts.get("answer")
        correct = answer is not None and normalized_match(str(answer), str(task.ground_truth))
        return EvalOutput(
            reward=float(correct),
            is_correct=correct,
            signals=[
                Signal(name="mcp/tool_calls", value=float(episode.artifacts.get("tool_calls", 0))),
                Signal(name="mcp/refused_calls", value=float(episode.artifacts.get("refused", 0))),
            ],
        )


mcp_answer_reward = McpAnswerReward()


def example_tasks(split: str) -> list[Task]:
    """Look key kI up on the notes server and say the word (train: every key; test: two)."""
    if split not in ("train", "test"):
        raise InputError(f"mcp:example has splits 'train' and 'test', not {split!r}")
    keys = range(len(EXAMPLE_WORDS)) if split == "train" else (1, 4)
    return [
        Task(
            id=f"notes-k{i}",
            instruction=f"look up k{i} and say the word",
            ground_truth=EXAMPLE_WORDS[i],
            metadata={"mcp_servers": [EXAMPLE_SERVER]},
        )
        for i in keys
    ]


def file_tasks(path: Path) -> list[Task]:
    """Tasks from a JSONL file, each declaring its servers (checked here, before any rollout)."""
    tasks = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            metadata = {**row.get("metadata", {}), "mcp_servers": row.get("mcp_servers")}
            if "sandbox" in row:
                metadata["sandbox"] = row["sandbox"]
            task = Task(
                id=str(row.get("id", number)),
                instruction=row["instruction"],
                ground_truth=row.get("ground_truth"),
                metadata=metadata,
            )
            server_specs(task.metadata)
            task_sandbox(task)
        except (json.JSONDecodeError, KeyError, InputError, TypeError) as exc:
            raise InputError(f"{path} line {number}: {exc}") from None
        tasks.append(task)
    if not tasks:
        raise InputError(f"{path} holds no tasks")
    return tasks


def cookbook_for(name: str) -> Cookbook:
    """``example``, or a JSONL file of tasks (its only split is ``train``; also used to validate)."""
    inside = False
    if name == "example":
        load, splits = example_tasks, ("train", "test")
    else:
        path = Path(name)
        if not path.is_file():
            raise LookupFailed(f"mcp:{name}: no such task file (name a JSONL file of tasks, or 'example')")
        rows = file_tasks(path)
        # One flow for the set: in a sandbox when any task runs a server there.
        inside = any(spec.sandbox for row in rows for spec in server_specs(row.metadata))

        def load(split: str) -> list[Task]:
            if split != "train":
                raise InputError(f"mcp:{name} (a task file) has one split, 'train', not {split!r}")
            return rows

        splits = ("train",)
    defaults = train_defaults(tasks_per_step=8, group_size=4, max_tokens=256)
    if "test" not in splits:
        defaults = {k: v for k, v in defaults.items() if k not in ("val_split", "val_every")}
    return Cookbook(
        name=f"mcp:{name}",
        flow=mcp_sandbox_flow if inside else mcp_flow,
        evaluator=mcp_answer_reward,
        load_tasks=load,
        description="an agent using its tasks' MCP servers' tools as native tool calls",
        splits=splits,
        train_defaults=defaults,
    )


adapter = Adapter(
    prefix="mcp",
    package="rllm-adapter-mcp",
    library="mcp",
    cookbook=cookbook_for,
    names=lambda: ["example"],
    flows=("tools", "multi-turn"),
    modes=("train", "eval"),
    description="MCP servers' tools (stdio or streamable HTTP) as native tool calls; tasks declare their servers",
)

__all__ = [
    "McpAnswerReward",
    "McpServerSpec",
    "adapter",
    "cookbook_for",
    "mcp_answer_reward",
    "mcp_flow",
    "mcp_sandbox_flow",
    "mcp_toolbox",
    "server_specs",
    "task_sandbox",
]
