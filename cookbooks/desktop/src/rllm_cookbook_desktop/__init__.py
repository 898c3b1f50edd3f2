"""Desktop agent: a vision-language model works a GUI app on a sandbox's virtual screen.

Each task is a Harbor-style task directory (``forms.py`` generates them) whose sandbox has a
desktop (``[environment.desktop]``) running the task's Tk form. The flow loops: screenshot (an
``image_url`` block; the gateway keeps each image content-addressed in the episode) -> the model's
native tool calls (click, double_click, drag, scroll, type_text, key, done) -> the actions, until
``done`` or the turn limit. Then the task's verifier reads the form's saved state: reward 1 or 0.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rllm.sdk import rollout, sampling_kwargs
from rllm.sdk.clients import async_openai
from rllm.sdk.cookbook import Cookbook, train_defaults
from rllm.sdk.desktop import Desktop, DesktopInputError
from rllm.sdk.evaluator import evaluator
from rllm.sdk.sandbox import SandboxError, current_sandbox, needs_sandbox
from rllm.sdk.task_dir import load_task_dirs, run_verifier, task_sandbox_spec
from rllm.types import AgentConfig, Episode, EvalOutput, Signal, Task, TerminationReason
from rllm.types.errors import InputError

TASKS_DIR = Path(__file__).parent / "tasks"
MAX_TURNS = 8
READY_TIMEOUT_S = 30.0
SYSTEM = (
    "You control a computer screen with the mouse and keyboard through tools. Each turn you see a "
    "screenshot; coordinates are pixels of that screenshot, (0, 0) at the top left. Call done when "
    "the task is finished."
)


def _tool(name: str, description: str, **params: str) -> dict[str, Any]:
    props = {key: {"type": kind} for key, kind in params.items()}
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": props, "required": list(params)},
        },
    }


TOOLS: list[dict[str, Any]] = [
    _tool("click", "Left-click at (x, y).", x="integer", y="integer"),
    _tool("double_click", "Double-click at (x, y).", x="integer", y="integer"),
    _tool("drag", "Drag from (x1, y1) to (x2, y2).", x1="integer", y1="integer", x2="integer", y2="integer"),
    _tool(
        "scroll",
        "Scroll at (x, y): dy wheel steps down (negative: up).",
        x="integer",
        y="integer",
        dy="integer",
    ),
    _tool("type_text", "Type text into the focused field.", text="string"),
    _tool("key", "Press a key or combination, e.g. Return, Tab, ctrl+a.", combo="string"),
    _tool("done", "Finish: the task is done."),
]


def load_tasks(split: str) -> list[Task]:
    """``train`` and ``test``: the ten shipped tasks; ``dir:/path``: task directories there
    (e.g. written by ``python -m rllm_cookbook_desktop.forms``). Each task gets the form app."""
    from rllm_cookbook_desktop.forms import with_app  # here: ``python -m ...forms`` runs it fresh

    if split.startswith("dir:"):
        return [with_app(task) for task in load_task_dirs(split[4:], allow_network=True)]
    if split not in ("train", "test"):
        raise InputError(f"the desktop cookbook has splits 'train', 'test' and 'dir:<folder>', not {split!r}")
    return [with_app(task) for task in load_task_dirs(TASKS_DIR)]


async def act(desktop: Desktop, name: str, arguments: str, scale: float) -> str:
    """Run one tool call; its result (or the refusal the model should read) as text."""
    try:
        args = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        args = None
    if not isinstance(args, dict):
        return f"error: {name} takes a JSON object of arguments"

    def point(x: str, y: str) -> tuple[int, int]:
        try:
            return round(float(args[x]) * scale), round(float(args[y]) * scale)
        except (KeyError, TypeError, ValueError):
            raise DesktopInputError(f"{name} needs numbers {x} and {y}") from None

    try:
        if name == "click":
            await desktop.click(*point("x", "y"))
        elif name == "double_click":
            await desktop.double_click(*point("x", "y"))
        elif name == "drag":
            await desktop.drag(*point("x1", "y1"), *point("x2", "y2"))
        elif name == "scroll":
            await desktop.scroll(*point("x", "y"), dy=int(args.get("dy", 1)))
        elif name == "type_text":
            await desktop.type_text(str(args.get("text", "")))
        elif name == "key":
            await desktop.key(str(args.get("combo", "")))
        else:
            return f"error: no tool named {name!r}; the tools are {', '.join(t['function']['name'] for t in TOOLS)}"
    except (DesktopInputError, ValueError) as exc:
        return f"error: {exc}"
    return "ok"


async def wait_for_app(desktop: Desktop) -> None:
    """The task's app marks itself shown with .form-ready; wait for it (an infra error if not)."""
    waited = await desktop.sandbox.exec(
        "while [ ! -e .form-ready ]; do sleep 0.02; done", timeout=READY_TIMEOUT_S
    )
    if not waited.ok:
        raise SandboxError(f"the task's app did not show its window within {READY_TIMEOUT_S:g} s")


@needs_sandbox(task_sandbox_spec)
@rollout
async def desktop_flow(task: Task, config: AgentConfig) -> Episode:
    desktop = Desktop(current_sandbox())
    await wait_for_app(desktop)
    max_turns = int(task.metadata.get("max_turns", MAX_TURNS))
    screen, scale = await desktop.screenshot_block()
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": [{"type": "text", "text": str(task.instruction)}, screen]},
    ]
    turns, actions, refused, finished = 0, 0, 0, False
    async with async_openai(config) as client:
        while turns < max_turns and not finished:
            turns += 1
            reply = await client.chat.completions.create(
                model=config.model,
                messages=messages,
                tools=TOOLS,
                **{"max_tokens": 256, **sampling_kwargs(config)},
            )
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls or []:
                if call.function.name == "done":
                    finished, result = True, "done"
                else:
                    result = await act(desktop, call.function.name, call.function.arguments, scale)
                    actions += 1
                    refused += result.startswith("error")
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
            if not finished:
                screen, scale = await desktop.screenshot_block()
                note = "The screen now:" if message.tool_calls else "Use the tools (call done when finished)."
                messages.append({"role": "user", "content": [{"type": "text", "text": note}, screen]})
    verdict = await run_verifier(desktop.sandbox, task)
    return Episode(
        task_id=task.id,
        artifacts={
            "verified": verdict.ok,
            "verify_output": (verdict.stdout + verdict.stderr)[-1000:],
            "done": finished,
            "turns": turns,
            "actions": actions,
            "refused": refused,
        },
        termination_reason=TerminationReason.DONE if finished else TerminationReason.MAX_TURNS,
    )


@evaluator
def desktop_evaluator(task: Task, episode: Episode) -> EvalOutput:
    solved = bool(episode.artifacts.get("verified"))
    return EvalOutput(
        reward=1.0 if solved else 0.0,
        is_correct=solved,
        signals=[
            Signal(name="done", value=float(bool(episode.artifacts.get("done")))),
            Signal(name="actions", value=float(episode.artifacts.get("actions", 0))),
            Signal(name="refused", value=float(episode.artifacts.get("refused", 0))),
        ],
    )


TRAIN_DEFAULTS = train_defaults(
    tasks_per_step=4,
    max_tokens=256,
    rollout={"sandbox_warm": 4},
    # Per-turn credit, as FrozenLake's: the verifier's outcome arrives after the last turn and
    # each earlier turn (screenshot -> tool calls) is credited with it discounted by gamma.
    algorithm={"step_credit": "turn", "gamma": 0.9},
)

cookbook = Cookbook(
    name="desktop",
    flow=desktop_flow,
    evaluator=desktop_evaluator,
    load_tasks=load_tasks,
    description="A Tk form on a sandbox's virtual screen, worked by a VLM through mouse/keyboard tool calls; reward 1 when the saved state is right.",
    train_defaults=TRAIN_DEFAULTS,
)

__all__ = ["TOOLS", "act", "cookbook", "desktop_evaluator", "desktop_flow", "load_tasks"]
