"""V1 on math: the flow generates N candidates and ranks them by pairwise self-verification.

Generation calls (role ``generate``) are rewarded by math-verify correctness; verification calls
(role ``verify``) by preferring the correct candidate of a mixed pair; calls on pairs with no
signal go to ``verify.no_signal`` for the zero-variance filter (see ``rllm.sdk.v1.credit``).
Settings: ``task.metadata["v1"]`` over ``config.metadata["v1"]`` over ``DEFAULT_V1``.
"""

from __future__ import annotations

from typing import Any

from rllm.sdk import rollout
from rllm.sdk.cookbook import Cookbook, train_defaults
from rllm.sdk.evaluator import evaluator
from rllm.sdk.rewards import extract_boxed, grade_math
from rllm.sdk.v1 import V1Settings, solve_v1, v1_credit
from rllm.types import AgentConfig, Episode, EvalOutput, Task
from rllm.types.errors import InputError
from rllm_cookbook_v1_math.data import load_hub_tasks, load_tasks

PROMPT = "Solve the problem. Put the final answer in \\boxed{{}}.\n\n{problem}"
# A knockout seeded by majority votes, each match asked in both orders (budget 2 * (n - 1)):
# the best format at this budget in benchmarks/v1_tournament.py (RESULTS.md, "v1_tournament.py").
DEFAULT_V1 = {"n": 4, "budget": 6, "format": "knockout", "both_orders": True}


def settings_for(task: Task, config: AgentConfig) -> V1Settings:
    """V1Settings from the task's and the config's ``metadata["v1"]`` over the cookbook defaults."""
    options = {**DEFAULT_V1, **config.metadata.get("v1", {}), **task.metadata.get("v1", {})}
    unknown = set(options) - set(V1Settings.__dataclass_fields__)
    if unknown:
        raise InputError(f"task {task.id!r}: unknown V1 option(s) {sorted(unknown)} in metadata['v1']")
    return V1Settings(**options)


def _answer_key(answer: str) -> str:
    return answer.replace(" ", "").removeprefix("x=")


@rollout
async def v1_math_flow(task: Task, config: AgentConfig) -> dict[str, Any]:
    if not isinstance(task.instruction, str):
        raise InputError(f"task {task.id!r}: v1-math needs a text instruction")
    outcome = await solve_v1(
        task.instruction,
        config,
        settings_for(task, config),
        extract_answer=extract_boxed,
        answer_key=_answer_key,
        generate_messages=lambda problem: [{"role": "user", "content": PROMPT.format(problem=problem)}],
    )
    return outcome.artifacts()


@evaluator
def v1_math_evaluator(task: Task, episode: Episode) -> EvalOutput:
    """Winner correctness as the episode's reward; each call rewarded on its own (v1_credit)."""
    candidates = episode.artifacts["v1"]["candidates"]
    correct = [grade_math(text, task.ground_truth) for text in candidates]
    credit = v1_credit(episode, correct)
    return EvalOutput(
        reward=float(credit.winner_correct),
        is_correct=credit.winner_correct,
        trajectory_rewards=credit.trajectory_rewards,
        signals=credit.signals,
        metadata={"correct": correct},
    )


TRAIN_DEFAULTS = train_defaults(
    tasks_per_step=8,
    group_size=2,
    max_tokens=512,
    # Validation samples too: at temperature 0 the N candidates would all be the same.
    rollout={"val_sampling": {"temperature": 1.0, "max_tokens": 512}},
    # Both roles train jointly, each with its own estimator; verify.no_signal groups (all 0) are
    # dropped by the zero-variance filter.
    algorithm={"estimator_by_role": {"generate": "grpo", "verify": "grpo"}, "filter_zero_variance": True},
)

cookbook = Cookbook(
    name="v1-math",
    flow=v1_math_flow,
    evaluator=v1_math_evaluator,
    load_tasks=load_tasks,
    description="V1 on math: N candidates, pairwise self-verification tournament, joint training of both roles.",
    train_defaults=TRAIN_DEFAULTS,
)

__all__ = ["cookbook", "load_hub_tasks", "load_tasks", "settings_for", "v1_math_evaluator", "v1_math_flow"]
