from __future__ import annotations

import pytest
from rllm_cookbook_frozenlake import FIXED_MAP, load_tasks, task_for_map
from rllm_cookbook_frozenlake.env import parse_action, render

from rllm.engine.plugins import load_cookbook

# The classic map: S at 0, G at 15; down, down, right, right, down, right is a shortest path.
PATH = ["down", "down", "right", "right", "down", "right"]


def test_render_and_parse():
    assert render(FIXED_MAP, 5).splitlines()[1] == "F P F H"
    assert parse_action("I think right. Final: Down") == 1
    assert parse_action("upward") is None


def test_sample_maps_are_4x4_with_start_and_goal():
    tasks = load_tasks("train") + load_tasks("test")
    assert len(tasks) == 30
    for t in tasks:
        desc = t.metadata["map"]
        assert len(desc) == 4 and desc[0][0] == "S" and desc[-1][-1] == "G"


HOLE_MAP = ["SHFF", "FFFF", "FFFF", "FFFG"]
OPEN_MAP = ["SFFF", "FFFF", "FFFF", "FFFG"]


async def test_flow_and_evaluator_against_a_scripted_model(scripted):
    tasks = [
        task_for_map("goal", FIXED_MAP),
        task_for_map("hole", HOLE_MAP),
        task_for_map("limit", OPEN_MAP, max_turns=3),
    ]
    kind_of = {t.instruction: t.id for t in tasks}

    def respond(body):
        kind = kind_of[body["messages"][0]["content"]]
        turn = sum(m["role"] == "assistant" for m in body["messages"])
        if kind == "goal":
            return f"Move: {PATH[turn]}"
        if kind == "hole":
            return "right"  # straight into the hole at (0, 1)
        return "left" if turn % 2 == 0 else "I am not sure"  # stays at the start; one invalid move

    episodes = await scripted(load_cookbook("frozenlake"), tasks, respond)
    by_id = {e.task_id: e for e in episodes}
    goal, hole, limit = by_id["goal"], by_id["hole"], by_id["limit"]
    assert goal.artifacts["outcome"] == "goal" and goal.artifacts["turns"] == 6
    assert goal.trajectories[0].reward == 1.0 and len(goal.trajectories[0].steps) == 6
    assert goal.termination_reason == "done"
    assert hole.artifacts["outcome"] == "hole" and hole.artifacts["turns"] == 1
    assert hole.trajectories[0].reward == 0.0
    assert limit.artifacts["outcome"] == "turn_limit" and limit.artifacts["turns"] == 3
    assert limit.termination_reason == "max_turns" and limit.artifacts["invalid_moves"] == 1
    assert limit.trajectories[0].reward == 0.0


@pytest.mark.slow
def test_two_training_steps(train, tmp_path):
    rows = train("frozenlake", tmp_path)
    assert all(row["episodes"] == 4 for row in rows)
