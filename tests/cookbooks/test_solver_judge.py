from __future__ import annotations

import pytest
from rllm_cookbook_solver_judge import JUDGE_ROLE, SOLVER_ROLES, generate, load_tasks, parse_choice

from rllm.engine.plugins import load_cookbook


def test_shipped_sample_is_the_generators_output():
    for split in ("train", "test"):
        assert [t.ground_truth for t in load_tasks(split)] == [r["answer"] for r in generate(split)]


@pytest.mark.parametrize(
    ("reply", "choice"),
    [
        ("<choice>2</choice>", 1),
        ("<choice>1</choice> no, <choice>2</choice>", 1),
        ("<choice>3</choice>", None),
        ("2", None),
    ],
)
def test_parse_choice(reply, choice):
    assert parse_choice(reply, 2) == choice


async def test_per_role_rewards_against_a_scripted_model(scripted):
    tasks = load_tasks("test")[:3]
    picks_right, picks_wrong, both_wrong = tasks
    truth = {t.instruction: t.ground_truth for t in tasks}
    solver_calls: dict[str, int] = {}

    def respond(body):
        prompt = body["messages"][0]["content"]
        question = prompt.split("\n")[0]
        right = f"\\boxed{{{truth[question]}}}"
        if "Which solution is right?" in prompt:
            first_is_right = prompt.split("Solution 1: ")[1].split("\n")[0] == right
            want_right = question == picks_right.instruction
            return "<choice>1</choice>" if first_is_right == want_right else "<choice>2</choice>"
        # The solvers run concurrently: whichever asks first is answered right, the other wrong.
        solver_calls[question] = solver_calls.get(question, 0) + 1
        if question == both_wrong.instruction or solver_calls[question] > 1:
            return "\\boxed{0}"
        return right

    episodes = await scripted(load_cookbook("solver-judge"), tasks, respond)
    by_id = {e.task_id: e for e in episodes}
    for e in episodes:
        assert sorted(t.role for t in e.trajectories) == sorted([*SOLVER_ROLES, JUDGE_ROLE])
    rewards = {tid: {t.role: t.reward for t in e.trajectories} for tid, e in by_id.items()}
    for task, judge in ((picks_right, 1.0), (picks_wrong, 0.0)):
        assert rewards[task.id]["solver_0"] + rewards[task.id]["solver_1"] == 1.0
        assert rewards[task.id]["judge"] == judge
        picked = SOLVER_ROLES[by_id[task.id].artifacts["choice"]]
        assert rewards[task.id][picked] == judge  # the judge is right exactly when its pick is
    assert rewards[both_wrong.id] == {"solver_0": 0.0, "solver_1": 0.0, "judge": 0.0}
    assert by_id[picks_right.id].is_correct and not by_id[picks_wrong.id].is_correct


def test_per_role_estimators_are_the_defaults():
    algo = load_cookbook("solver-judge").train_defaults["algorithm"]
    assert algo["estimator_by_role"] == {"solver_0": "grpo", "solver_1": "grpo", "judge": "reinforce"}


@pytest.mark.slow
def test_two_training_steps_train_every_role(train, tmp_path):
    rows = train("solver-judge", tmp_path, "algorithm.filter_zero_variance=false")
    assert all(row["train/sequences"] == 3 * row["episodes"] for row in rows)
    assert {"advantage/solver_0/mean", "advantage/solver_1/mean", "advantage/judge/mean"} <= set(rows[-1])
