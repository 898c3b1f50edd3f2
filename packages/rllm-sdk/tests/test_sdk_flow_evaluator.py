"""@rollout / @evaluator / protocols and the evaluator-output normaliser."""

from __future__ import annotations

import asyncio

import pytest

from rllm.sdk import (
    AgentConfig,
    Episode,
    EvalOutput,
    Task,
    as_evaluator,
    as_flow,
    evaluator,
    final_answer,
    rollout,
    to_eval_output,
)
from rllm.types import Message, Step, Trajectory

TASK = Task(id="t", instruction="2+2?", ground_truth="4")
CONFIG = AgentConfig(base_url="http://gw/sessions/s1/v1")


def test_rollout_wraps_sync_and_async_functions_and_keeps_them_callable():
    @rollout
    def sync_flow(task: Task, config: AgentConfig) -> dict:
        return {"answer": task.ground_truth}

    @rollout(name="solver", max_turns=3)
    async def async_flow(task: Task, config: AgentConfig) -> str:
        return config.base_url

    assert not sync_flow.is_async and sync_flow.name == "sync_flow"
    assert sync_flow(TASK, CONFIG) == {"answer": "4"}
    assert async_flow.is_async and async_flow.name == "solver" and async_flow.max_turns == 3
    assert asyncio.run(async_flow.run(TASK, CONFIG)) == CONFIG.base_url


def test_rollout_refuses_functions_with_the_wrong_arity():
    with pytest.raises(TypeError, match=r"must accept 2 positional arguments"):

        @rollout
        def one_arg(task):
            return None


def test_class_based_flow_and_evaluator_are_normalised():
    class Agent:
        async def run(self, task: Task, config: AgentConfig) -> str:
            return "x"

    class Grader:
        def evaluate(self, task: Task, episode: Episode) -> bool:
            return True

    flow = as_flow(Agent())
    assert flow.is_async and flow.name == "Agent"
    grader = as_evaluator(Grader())
    assert not grader.is_async and grader.evaluate(TASK, Episode(task_id="t")) is True
    with pytest.raises(TypeError, match="instantiate it first"):
        as_flow(Agent)
    with pytest.raises(TypeError, match="expected a flow"):
        as_flow(42)


@pytest.mark.parametrize(
    ("value", "reward", "correct"),
    [
        (EvalOutput(reward=0.5, is_correct=True), 0.5, True),
        (True, 1.0, True),
        (False, 0.0, False),
        (0.25, 0.25, None),
        (1, 1.0, None),
        ((0.7, True), 0.7, True),
    ],
)
def test_to_eval_output_accepts_every_documented_shape(value, reward, correct):
    out = to_eval_output(value)
    assert out.reward == reward and out.is_correct is correct


@pytest.mark.parametrize("value", ["1.0", None, (1.0, "yes"), [1.0], float("nan")])
def test_to_eval_output_rejects_other_values_naming_the_source(value):
    with pytest.raises((TypeError, ValueError), match="my_eval"):
        to_eval_output(value, source="my_eval")


def test_evaluator_decorator_supports_async_functions():
    @evaluator
    async def grade(task: Task, episode: Episode) -> tuple[float, bool]:
        return 1.0, True

    assert grade.is_async and asyncio.run(grade.evaluate(TASK, Episode(task_id="t"))) == (1.0, True)


def test_final_answer_prefers_artifacts_then_last_output_of_role():
    traj = Trajectory(
        role="solver",
        steps=[
            Step(output=Message(role="assistant", content="first")),
            Step(output=Message(role="assistant", content="last")),
        ],
    )
    judge = Trajectory(role="judge", steps=[Step(output=Message(role="assistant", content="VERDICT"))])
    ep = Episode(task_id="t", trajectories=[traj, judge])
    assert final_answer(ep) == "last"
    assert final_answer(ep, role="judge") == "VERDICT"
    ep.artifacts["answer"] = 42
    assert final_answer(ep) == "42"
    assert final_answer(Episode(task_id="t")) == ""
