"""Terminal agent: a multi-turn agent that solves shell tasks in a sandbox.

Each task is a Harbor-style task directory (``rllm.sdk.task_dir``). The engine gives every
rollout its own sandbox with the task's setup already run; the model works through a native
``run_shell`` tool and ends with ``submit``. The flow sees only the agent's view of the task
(never its tests or solution). Then the evaluator, in the same sandbox once the agent is done,
copies the task's hidden tests in and its verify script decides the reward: 1 when it passes,
else 0.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rllm.sdk import rollout
from rllm.sdk.clients import async_openai
from rllm.sdk.cookbook import Cookbook, train_defaults
from rllm.sdk.evaluator import evaluator
from rllm.sdk.sandbox import ExecResult, Sandbox, current_sandbox, needs_sandbox
from rllm.sdk.task_dir import load_task_dirs, run_verifier, task_sandbox_spec
from rllm.sdk.tool_loop import Toolbox, ToolError, run_tool_loop
from rllm.types import AgentConfig, Episode, EvalOutput, Signal, Task, TerminationReason
from rllm.types.errors import InputError

TASKS_DIR = Path(__file__).parent / "tasks"
MAX_TURNS = 12
TOOL_OUTPUT_CHARS = 4000
SYSTEM = (
    "You are working in a Linux shell, in the task's folder. Run commands with the run_shell tool "
    "(each call is a fresh /bin/sh in the same folder; files persist, processes do not). When the "
    "task is done, call submit."
)
NUDGE = "Use the run_shell tool to work on the task, or call submit when it is done."
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "run_shell",
            "description": "Run a shell command in the task's folder; returns its exit code, stdout and stderr.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "the command line"}},
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "submit",
            "description": "Finish: the task is done.",
            "parameters": {"type": "object", "properties": {}},
        },
    },
]


def load_tasks(split: str) -> list[Task]:
    """``train`` and ``test``: the shipped tasks (the same ten; a tiny sample to learn the
    harness on); ``dir:/path``: every task directory under that folder."""
    if split.startswith("dir:"):
        # Loaded even when a task asks for network: the consent is the run's
        # sandbox.allow_task_network, which the engine checks before any rollout starts.
        return load_task_dirs(split[4:], allow_network=True)
    if split not in ("train", "test"):
        raise InputError(
            f"the terminal cookbook has splits 'train', 'test' and 'dir:<folder>', not {split!r}"
        )
    return load_task_dirs(TASKS_DIR)


def format_result(result: ExecResult) -> str:
    """What the model sees of a command: exit code, then stdout and stderr, cut to a budget."""
    text = f"exit code: {result.exit_code}" + (" (timed out)" if result.timed_out else "")
    text += f"\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    if len(text) > TOOL_OUTPUT_CHARS:
        text = text[:TOOL_OUTPUT_CHARS] + "\n[... cut ...]"
    return text


def shell_toolbox(sandbox: Sandbox, deadline: float) -> Toolbox:
    """``run_shell`` in the rollout's sandbox (each command's timeout what is left of the
    deadline, 1 to 60 s) and ``submit``, which ends the loop."""

    async def run_shell(args: dict[str, Any]) -> str:
        if "command" not in args:
            raise ToolError('run_shell takes {"command": "<command line>"}')
        command = args["command"]
        if not isinstance(command, str) or not command.strip():
            raise ToolError("command must be a non-empty string")
        budget = max(1.0, min(60.0, deadline - time.monotonic()))
        return format_result(await sandbox.exec(command, timeout=budget))

    return Toolbox(TOOLS, {"run_shell": run_shell}, stop_tools={"submit": "submitted"})


@needs_sandbox(task_sandbox_spec)
@rollout
async def terminal_flow(task: Task, config: AgentConfig) -> Episode:
    sandbox = current_sandbox()
    deadline = time.monotonic() + float(task.metadata.get("agent_timeout_s", 300.0))
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": str(task.instruction)},
    ]
    async with async_openai(config) as client:
        result = await run_tool_loop(
            client,
            config,
            messages,
            shell_toolbox(sandbox, deadline),
            max_turns=int(task.metadata.get("max_turns", MAX_TURNS)),
            max_tokens=512,
            nudge=NUDGE,
            deadline=deadline,
        )
    return Episode(
        task_id=task.id,
        artifacts={
            "submitted": result.finished,
            "turns": len(result.turns),
            "commands": result.tool_calls,
        },
        termination_reason=TerminationReason.DONE if result.finished else TerminationReason.MAX_TURNS,
    )


@evaluator
async def terminal_evaluator(task: Task, episode: Episode) -> EvalOutput:
    """The task's hidden tests, run in the rollout's sandbox now that the agent is done (the
    engine keeps it open for the evaluator): reward 1 when they pass."""
    verdict = await run_verifier(current_sandbox(), task)
    return EvalOutput(
        reward=1.0 if verdict.ok else 0.0,
        is_correct=verdict.ok,
        signals=[
            Signal(name="submitted", value=float(bool(episode.artifacts.get("submitted")))),
            Signal(name="commands", value=float(episode.artifacts.get("commands", 0))),
        ],
        metadata={
            "verify_exit": verdict.exit_code,
            "verify_output": (verdict.stdout + verdict.stderr)[-2000:],
        },
    )


TRAIN_DEFAULTS = train_defaults(tasks_per_step=8, max_tokens=512, rollout={"sandbox_warm": 8})

cookbook = Cookbook(
    name="terminal",
    flow=terminal_flow,
    evaluator=terminal_evaluator,
    load_tasks=load_tasks,
    description="Shell tasks in a sandbox via a run_shell tool; reward 1 when the task's verify script passes.",
    train_defaults=TRAIN_DEFAULTS,
)

__all__ = ["TOOLS", "cookbook", "format_result", "load_tasks", "terminal_evaluator", "terminal_flow"]
