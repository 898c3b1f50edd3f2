"""Desktop agent: a vision-language model works a GUI app on a sandbox's virtual screen.

Each task is a Harbor-style task directory (``forms.py`` generates them) whose sandbox has a
desktop (``[environment.desktop]``) running the task's Tk form. The flow loops: screenshot (an
``image_url`` block; the gateway keeps each image content-addressed in the episode) -> the model's
native tool calls (click, double_click, drag, scroll, type_text, key, done) -> the actions, until
``done`` or the turn limit. The flow sees only the agent's view of the task (never its checker or
solution); then the evaluator, in the same sandbox once the agent is done, copies the checker in
and reads the form's saved state: reward 1 or 0.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from rllm.sdk import rollout
from rllm.sdk.clients import async_openai
from rllm.sdk.cookbook import Cookbook, train_defaults
from rllm.sdk.desktop import Desktop, DesktopInputError
from rllm.sdk.evaluator import evaluator
from rllm.sdk.sandbox import SandboxError, current_sandbox, needs_sandbox
from rllm.sdk.task_dir import load_task_dirs, run_verifier, task_sandbox_spec
from rllm.sdk.tool_loop import Toolbox, ToolError, ToolHandler, ToolTurn, run_tool_loop
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
NUDGE = "Use the tools (call done when finished)."


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


class Screen:
    """One rollout's desktop as the model's tools work it: each action at the scale of the
    screenshot the model last saw (a screenshot may be downscaled)."""

    def __init__(self, desktop: Desktop, scale: float = 1.0) -> None:
        self.desktop = desktop
        self.scale = scale

    def toolbox(self) -> Toolbox:
        d, at = self.desktop, self._point
        actions: dict[str, Callable[[dict[str, Any]], Awaitable[None]]] = {
            "click": lambda a: d.click(*at("click", a, "x", "y")),
            "double_click": lambda a: d.double_click(*at("double_click", a, "x", "y")),
            "drag": lambda a: d.drag(*at("drag", a, "x1", "y1"), *at("drag", a, "x2", "y2")),
            "scroll": lambda a: d.scroll(*at("scroll", a, "x", "y"), dy=_whole(a, "scroll", "dy", 1)),
            "type_text": lambda a: d.type_text(str(a.get("text", ""))),
            "key": lambda a: d.key(str(a.get("combo", ""))),
        }
        return Toolbox(
            TOOLS,
            {name: _answered_ok(action) for name, action in actions.items()},
            stop_tools={"done": "done"},
            model_errors=(DesktopInputError,),  # off the screen, an unknown key, text too long
        )

    async def look(self, turn: ToolTurn) -> dict[str, Any]:
        """The next user message: a fresh screenshot, and a nudge after a reply without tool calls."""
        screen, self.scale = await self.desktop.screenshot_block()
        note = "The screen now:" if turn.calls else NUDGE
        return {"role": "user", "content": [{"type": "text", "text": note}, screen]}

    def _point(self, name: str, args: dict[str, Any], x: str, y: str) -> tuple[int, int]:
        try:
            return round(float(args[x]) * self.scale), round(float(args[y]) * self.scale)
        except (KeyError, TypeError, ValueError, OverflowError):  # missing, not a number, nan, inf
            raise ToolError(f"{name} needs numbers {x} and {y}") from None


def _whole(args: dict[str, Any], name: str, key: str, default: int) -> int:
    try:
        return int(args.get(key, default))
    except (TypeError, ValueError, OverflowError):
        raise ToolError(f"{name} needs a whole number {key}") from None


def _answered_ok(action: Callable[[dict[str, Any]], Awaitable[None]]) -> ToolHandler:
    async def handler(args: dict[str, Any]) -> str:
        await action(args)
        return "ok"

    return handler


async def act(desktop: Desktop, name: str, arguments: str, scale: float) -> str:
    """Run one tool call; its result (or the refusal the model should read) as text."""
    return (await Screen(desktop, scale).toolbox().call(name, arguments)).result


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
    screen, scale = await desktop.screenshot_block()
    view = Screen(desktop, scale)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": [{"type": "text", "text": str(task.instruction)}, screen]},
    ]
    async with async_openai(config) as client:
        result = await run_tool_loop(
            client,
            config,
            messages,
            view.toolbox(),
            max_turns=int(task.metadata.get("max_turns", MAX_TURNS)),
            max_tokens=256,
            follow_up=view.look,
        )
    return Episode(
        task_id=task.id,
        artifacts={
            "done": result.finished,
            "turns": len(result.turns),
            "actions": result.tool_calls,
            "refused": result.refused,
        },
        termination_reason=TerminationReason.DONE if result.finished else TerminationReason.MAX_TURNS,
    )


@evaluator
async def desktop_evaluator(task: Task, episode: Episode) -> EvalOutput:
    """The task's hidden checker, run in the rollout's sandbox now that the agent is done (the
    engine keeps it open for the evaluator): reward 1 when the saved state is right."""
    verdict = await run_verifier(current_sandbox(), task)
    solved = verdict.ok
    return EvalOutput(
        reward=1.0 if solved else 0.0,
        is_correct=solved,
        signals=[
            Signal(name="done", value=float(bool(episode.artifacts.get("done")))),
            Signal(name="actions", value=float(episode.artifacts.get("actions", 0))),
            Signal(name="refused", value=float(episode.artifacts.get("refused", 0))),
        ],
        metadata={"verify_output": (verdict.stdout + verdict.stderr)[-1000:]},
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
