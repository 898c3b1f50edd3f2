"""Solver-judge: N solvers answer independently (each its own role and trajectory), then a judge
picks one solution. A solver is rewarded when its ``\\boxed{}`` answer is right; the judge when
the solution it picked is right. Roles train with their own estimators (solvers: grpo, judge:
reinforce)."""

from __future__ import annotations

import asyncio
import re

from rllm.sdk import rollout, sampling_kwargs
from rllm.sdk.clients import async_openai
from rllm.sdk.cookbook import Cookbook, train_defaults
from rllm.sdk.evaluator import evaluator
from rllm.sdk.rewards import extract_boxed, numeric_match
from rllm.types import AgentConfig, Episode, EvalOutput, Task
from rllm_cookbook_solver_judge.data import generate, load_tasks

N_SOLVERS = 2
SOLVER_ROLES = [f"solver_{i}" for i in range(N_SOLVERS)]
JUDGE_ROLE = "judge"
_CHOICE = re.compile(r"<choice>\s*(\d+)\s*</choice>")


async def _ask(config: AgentConfig, role: str, prompt: str, max_tokens: int) -> str:
    async with async_openai(config, role=role) as client:
        reply = await client.chat.completions.create(
            model=config.model,
            messages=[{"role": "user", "content": prompt}],
            **{"max_tokens": max_tokens, **sampling_kwargs(config)},
        )
    return reply.choices[0].message.content or ""


def solver_prompt(question: str) -> str:
    return f"{question}\nPut the final answer in \\boxed{{}}."


def judge_prompt(question: str, solutions: list[str]) -> str:
    listed = "\n".join(f"Solution {i + 1}: {s}" for i, s in enumerate(solutions))
    return f"{question}\n{listed}\nWhich solution is right? Reply <choice>number</choice>."


def parse_choice(reply: str, n: int) -> int | None:
    """The 0-based index of the chosen solution (the last ``<choice>k</choice>``, 1-based), or None."""
    found = _CHOICE.findall(reply)
    if not found:
        return None
    k = int(found[-1])
    return k - 1 if 1 <= k <= n else None


@rollout
async def solver_judge_flow(task: Task, config: AgentConfig) -> dict:
    prompt = solver_prompt(str(task.instruction))
    solutions = await asyncio.gather(*(_ask(config, role, prompt, 256) for role in SOLVER_ROLES))
    verdict = await _ask(config, JUDGE_ROLE, judge_prompt(str(task.instruction), list(solutions)), 64)
    choice = parse_choice(verdict, len(solutions))
    return {
        "solutions": list(solutions),
        "judge_reply": verdict,
        "choice": choice,
        "answer": solutions[choice] if choice is not None else "",
    }


def is_right(solution: str, truth: object) -> bool:
    boxed = extract_boxed(solution)
    return boxed is not None and numeric_match(boxed, str(truth))


@evaluator
def solver_judge_evaluator(task: Task, episode: Episode) -> EvalOutput:
    solutions = episode.artifacts.get("solutions", [])
    right = [is_right(s, task.ground_truth) for s in solutions]
    choice = episode.artifacts.get("choice")
    judge_right = choice is not None and 0 <= choice < len(right) and right[choice]
    rewards = {role: float(ok) for role, ok in zip(SOLVER_ROLES, right, strict=False)}
    rewards[JUDGE_ROLE] = float(judge_right)
    return EvalOutput(reward=float(judge_right), is_correct=judge_right, trajectory_rewards=rewards)


TRAIN_DEFAULTS = train_defaults(
    group_size=4,
    max_tokens=256,
    algorithm={"estimator_by_role": {**dict.fromkeys(SOLVER_ROLES, "grpo"), JUDGE_ROLE: "reinforce"}},
)

cookbook = Cookbook(
    name="solver-judge",
    flow=solver_judge_flow,
    evaluator=solver_judge_evaluator,
    load_tasks=load_tasks,
    description=f"{N_SOLVERS} solvers and a judge per episode; per-role rewards and estimators.",
    train_defaults=TRAIN_DEFAULTS,
)

__all__ = [
    "JUDGE_ROLE",
    "SOLVER_ROLES",
    "cookbook",
    "generate",
    "is_right",
    "judge_prompt",
    "load_tasks",
    "parse_choice",
    "solver_judge_evaluator",
    "solver_judge_flow",
    "solver_prompt",
]
