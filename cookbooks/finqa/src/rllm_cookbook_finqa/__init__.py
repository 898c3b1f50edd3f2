"""FinQA: a ReAct loop with native OpenAI function calling over the task's financial tables.

Each turn the model either calls tools (list_tables, get_table_schema, sql_query, calculator;
the results go back as ``tool`` messages) or answers. The loop ends at a reply without tool
calls that says ``FINAL ANSWER: ...``, or at the turn limit. Each rollout opens its own
in-memory database.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

from rllm.sdk import rollout
from rllm.sdk.clients import async_openai
from rllm.sdk.cookbook import Cookbook, refuse_unknown_options, train_defaults
from rllm.sdk.rewards import numeric_match
from rllm.sdk.tool_loop import run_tool_loop
from rllm.types import AgentConfig, Episode, EvalOutput, Signal, Task, TerminationReason
from rllm.types.errors import InputError
from rllm_cookbook_finqa.calculator import calculate
from rllm_cookbook_finqa.data import generate, load_tasks
from rllm_cookbook_finqa.tools import TOOLS, FinanceDB

MAX_TURNS = 20
SYSTEM = (
    "You answer questions about company financials. Use the tools to find the tables, read "
    "them with SQL and compute with the calculator. When you know the answer, reply without "
    "tool calls as: FINAL ANSWER: <number>"
)
NUDGE = "Call a tool, or reply with FINAL ANSWER: <number>."
_FINAL = re.compile(r"FINAL ANSWER:\s*(.+)", re.IGNORECASE | re.DOTALL)


def final_answer_of(text: str) -> str | None:
    found = _FINAL.search(text)
    return found.group(1).strip() if found else None


@rollout
async def finqa_flow(task: Task, config: AgentConfig) -> Episode:
    db = FinanceDB(task.metadata["tables"])
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": str(task.instruction)},
    ]
    try:
        async with async_openai(config) as client:
            result = await run_tool_loop(
                client,
                config,
                messages,
                db.toolbox(),
                max_turns=MAX_TURNS,
                max_tokens=512,
                final_answer=final_answer_of,
                nudge=NUDGE,
            )
    finally:
        db.close()
    return Episode(
        task_id=task.id,
        artifacts={
            "answer": result.answer,
            "accessed_tables": list(db.accessed),
            "turns": len(result.turns),
            "tool_calls": result.tool_calls,
        },
        termination_reason=TerminationReason.DONE if result.finished else TerminationReason.MAX_TURNS,
    )


def answer_matches(answer: str | None, truth: Any, rel_tol: float = 1e-2) -> bool:
    """Numeric match within ``rel_tol``; "12.5%" reads as 12.5, and simple arithmetic is computed."""
    if answer is None:
        return False
    text = answer.replace("%", "").replace("$", "").strip()
    try:
        value = calculate(text.split()[0]) if text else None
    except (ValueError, IndexError):
        value = None
    reference = float(truth) if isinstance(truth, int | float) else str(truth)
    if value is not None and numeric_match(value, reference, rel_tol=rel_tol, abs_tol=1e-6):
        return True
    return numeric_match(text, reference, rel_tol=rel_tol, abs_tol=1e-6)


class FinQAEvaluator:
    """Numeric tolerance, or ``judge`` (an ``rllm.sdk.rewards.LLMJudge``) when given;
    ``table_bonus`` is added when the agent read the table the question is about."""

    def __init__(self, judge: Any = None, table_bonus: float = 0.0) -> None:
        self.judge = judge
        self.table_bonus = table_bonus

    async def evaluate(self, task: Task, episode: Episode) -> EvalOutput:
        answer = episode.artifacts.get("answer")
        if self.judge is not None and answer is not None:
            verdict = await self.judge.evaluate(task, episode)
            correct, meta = bool(verdict.is_correct), dict(verdict.metadata)
        else:
            correct, meta = answer_matches(answer, task.ground_truth), {}
        read_table = task.metadata.get("table") in episode.artifacts.get("accessed_tables", [])
        return EvalOutput(
            reward=(1.0 if correct else 0.0) + (self.table_bonus if read_table else 0.0),
            is_correct=correct,
            signals=[
                Signal(name="read_table", value=float(read_table)),
                Signal(name="turns", value=float(episode.artifacts.get("turns", 0))),
            ],
            metadata=meta,
        )


OPTIONS = ("judge_base_url", "judge_model", "judge_api_key_env", "table_bonus")


def evaluator_from_options(options: dict[str, Any]) -> FinQAEvaluator:
    """The evaluator for a run's ``cookbook_options`` (``rllm eval --option``), falling back to the
    ``FINQA_*`` environment variables: an LLM judge when a base URL and a model are given, its API
    key read from the environment variable ``judge_api_key_env`` names (keys stay out of configs)."""
    refuse_unknown_options("finqa", options, OPTIONS)
    env = os.environ.get
    url = options.get("judge_base_url", env("FINQA_JUDGE_BASE_URL"))
    model = options.get("judge_model", env("FINQA_JUDGE_MODEL"))
    bonus = options.get("table_bonus", env("FINQA_TABLE_BONUS") or 0)
    try:
        bonus = float(bonus)
    except (TypeError, ValueError):
        raise InputError(f"finqa option table_bonus must be a number, got {bonus!r}") from None
    if bool(url) != bool(model):
        raise InputError("finqa's judge needs both judge_base_url and judge_model")
    judge = None
    if url and model:
        from rllm.sdk.rewards import LLMJudge

        key = env(str(options.get("judge_api_key_env", "FINQA_JUDGE_API_KEY")), "EMPTY")
        judge = LLMJudge(base_url=str(url), model=str(model), api_key=key)
    return FinQAEvaluator(judge, bonus)


def configure(options: dict[str, Any]) -> Cookbook:
    return dataclasses.replace(cookbook, evaluator=evaluator_from_options(options))


finqa_evaluator = evaluator_from_options({})

TRAIN_DEFAULTS = train_defaults(tasks_per_step=8, max_tokens=512)

cookbook = Cookbook(
    name="finqa",
    flow=finqa_flow,
    evaluator=finqa_evaluator,
    load_tasks=load_tasks,
    description="FinQA ReAct agent with native tool calls over SQLite tables; numeric-tolerance reward.",
    train_defaults=TRAIN_DEFAULTS,
    configure=configure,
)

__all__ = [
    "TOOLS",
    "FinQAEvaluator",
    "FinanceDB",
    "answer_matches",
    "cookbook",
    "evaluator_from_options",
    "finqa_evaluator",
    "finqa_flow",
    "generate",
    "load_tasks",
]
