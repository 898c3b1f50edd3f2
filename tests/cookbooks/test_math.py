from __future__ import annotations

import json

import pytest
from rllm_cookbook_math import generate, load_tasks

from rllm.engine.plugins import load_cookbook


def test_shipped_sample_is_the_generators_output():
    for split in ("train", "test"):
        tasks = load_tasks(split)
        assert [t.ground_truth for t in tasks] == [r["answer"] for r in generate(split)]
        assert 10 <= len(tasks) <= 50


def test_unknown_split_is_refused():
    with pytest.raises(ValueError, match="hub:train"):
        load_tasks("validation")


async def test_flow_and_evaluator_against_a_scripted_model(scripted):
    cookbook = load_cookbook("math")
    tasks = load_tasks("test")[:4]
    truth = {t.instruction: t.ground_truth for t in tasks}
    wrong = tasks[1].instruction

    def respond(body):
        question = body["messages"][0]["content"].split("\n")[0]
        return "The answer is \\boxed{-12345}." if question == wrong else f"So \\boxed{{{truth[question]}}}."

    episodes = await scripted(cookbook, tasks, respond)
    rewards = {e.task_id: e.trajectories[0].reward for e in episodes}
    assert rewards == {t.id: (0.0 if t.instruction == wrong else 1.0) for t in tasks}
    assert all(e.termination_reason == "done" and len(e.trajectories[0].steps) == 1 for e in episodes)
    assert json.dumps(episodes[0].artifacts)  # artifacts stay JSON


@pytest.mark.slow
def test_two_training_steps(train, tmp_path):
    rows = train("math", tmp_path)
    assert all(row["episodes"] == 4 for row in rows)
