from __future__ import annotations

import pytest
from rllm_cookbook_frozenlake import FIXED_MAP, load_tasks, task_for_map
from rllm_cookbook_frozenlake.data import instruction
from rllm_cookbook_frozenlake.env import cell_name, observation, parse_action

from rllm.engine.plugins import load_cookbook

# The classic map: S at 0, G at 15; down, down, right, right, down, right is a shortest path.
PATH = ["down", "down", "right", "right", "down", "right"]


def test_parse():
    assert parse_action("I think right. Final: Down") == 1
    assert parse_action("upward") is None


def test_the_position_is_one_cell_name_and_the_instruction_names_the_start():
    assert [cell_name(FIXED_MAP, p) for p in (0, 5, 15)] == ["a", "f", "p"]
    assert observation(FIXED_MAP, 9) == "at j"
    instruction = load_tasks("fixed")[0].instruction
    assert instruction == "map SFFF FHFH FFFH HFFG cells a - p by rows . move left down right up . at a"
    with pytest.raises(ValueError, match="at most 26 cells"):
        cell_name(["S" + "F" * 5] * 6, 0)


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
    kind_of = {4: "goal", 1: "hole", 0: "limit"}  # the maps' numbers of holes
    seen: list[str] = []  # where the goal episode was told it is, turn by turn
    limit_turns = iter(range(3))

    def respond(body):
        assert len(body["messages"]) == 1  # each turn is one fresh prompt
        prompt = body["messages"][0]["content"]
        kind, here = kind_of[prompt.count("H")], " ".join(prompt.split()[-2:])
        if kind == "goal":
            seen.append(here)
            return f"Move: {PATH[len(seen) - 1]}"
        if kind == "hole":
            return "right"  # straight into the hole at (0, 1)
        return "left" if next(limit_turns) % 2 == 0 else "I am not sure"  # stays; one invalid move

    episodes = await scripted(load_cookbook("frozenlake"), tasks, respond)
    by_id = {e.task_id: e for e in episodes}
    goal, hole, limit = by_id["goal"], by_id["hole"], by_id["limit"]
    assert goal.artifacts["outcome"] == "goal" and goal.artifacts["turns"] == 6
    assert goal.trajectories[0].reward == 1.0 and len(goal.trajectories[0].steps) == 6
    assert goal.termination_reason == "done"
    assert seen == ["at a", "at e", "at i", "at j", "at k", "at o"]  # the cells along the path
    assert hole.artifacts["outcome"] == "hole" and hole.artifacts["turns"] == 1
    assert hole.trajectories[0].reward == 0.0
    assert limit.artifacts["outcome"] == "turn_limit" and limit.artifacts["turns"] == 3
    assert limit.termination_reason == "max_turns" and limit.artifacts["invalid_moves"] == 1
    assert limit.trajectories[0].reward == 0.0


@pytest.mark.slow
def test_two_training_steps(train, tmp_path):
    rows = train("frozenlake", tmp_path)
    assert all(row["episodes"] == 4 for row in rows)


def test_progress_shaping():
    from rllm_cookbook_frozenlake import progress

    assert progress(FIXED_MAP, 0) == 0.0 and progress(FIXED_MAP, 15) == 1.0
    assert progress(FIXED_MAP, 10) == pytest.approx(4 / 6)
    assert progress(FIXED_MAP, 3) == pytest.approx(1 / 6)  # beside a hole: far by a safe walk


def test_potential_shaping_adds_up_to_the_final_cell():
    from rllm_cookbook_frozenlake import frozenlake_progress_evaluator, potential

    from rllm.types import Episode, Step, Trajectory

    task = task_for_map("t", FIXED_MAP)
    positions = [4, 8, 9, 10, 14, 15]  # the goal path
    steps = [Step() for _ in positions]
    episode = Episode(
        task_id="t",
        trajectories=[Trajectory(role="default", steps=steps)],
        artifacts={"outcome": "goal", "positions": positions},
    )
    out = frozenlake_progress_evaluator.evaluate(task, episode)
    assert out.reward == 1.0 and out.is_correct
    gains = [s.reward for s in steps[:-1]] + [out.trajectory_rewards["default"]]
    assert sum(gains) == pytest.approx(1.0) and all(g > 0 for g in gains)
    assert potential(FIXED_MAP, 5) == 0.0  # a hole


def test_the_words_prompt_draws_the_grid_with_the_agent_and_names_its_row_and_column():
    [task] = load_cookbook("frozenlake").with_options({"prompt": "words"}).load_tasks("fixed")
    assert task.metadata["prompt"] == "words"
    assert "P F F F\nF H F H\nF F F H\nH F F G\n" in task.instruction
    assert "You are at row 1, column 1" in task.instruction
    assert instruction(FIXED_MAP, 9, "words").split("\n")[3] == "F P F H"  # row 3, column 2
    assert "row 3, column 2" in instruction(FIXED_MAP, 9, "words")
    # The default is the compact prompt, with no prompt key in the task.
    assert "prompt" not in load_cookbook("frozenlake").load_tasks("fixed")[0].metadata


async def test_the_words_prompt_plays_through_the_flow_turn_by_turn(scripted):
    cookbook = load_cookbook("frozenlake-progress").with_options({"prompt": "words"})
    [task] = cookbook.load_tasks("fixed")
    told: list[str] = []

    def respond(body):
        prompt = body["messages"][0]["content"]
        told.append(prompt.split("You are at ")[1].split(" (")[0])
        return f"I will go {PATH[len(told) - 1]}."

    [episode] = await scripted(cookbook, [task], respond)
    assert episode.artifacts["outcome"] == "goal" and episode.artifacts["invalid_moves"] == 0
    assert told == [
        "row 1, column 1",
        "row 2, column 1",
        "row 3, column 1",
        "row 3, column 2",
        "row 3, column 3",
        "row 4, column 3",
    ]


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"prompt": "prose"}, "prompt must be one of"),
        ({"promt": "words"}, r"unknown frozenlake option\(s\) \['promt'\]"),
    ],
)
def test_a_bad_frozenlake_option_is_refused_naming_it(options, error):
    with pytest.raises(ValueError, match=error):
        load_cookbook("frozenlake").with_options(options)
