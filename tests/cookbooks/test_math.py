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


async def test_format_coef_takes_off_an_unboxed_answer_s_reward_through_a_scripted_model(scripted):
    """cookbook_options.format_coef: a right answer without a box scores 1 - coef (it is still
    correct); a boxed one 1. The math-arith cookbook takes the same option."""
    cookbook = load_cookbook("math").with_options({"format_coef": 0.25})
    tasks = load_tasks("test")[:2]
    truth = {t.instruction: t.ground_truth for t in tasks}
    plain = tasks[0].instruction

    def respond(body):
        question = body["messages"][0]["content"].split("\n")[0]
        return f"It is {truth[question]}" if question == plain else f"So \\boxed{{{truth[question]}}}."

    episodes = await scripted(cookbook, tasks, respond)
    by_task = {e.task_id: e for e in episodes}
    assert by_task[tasks[0].id].trajectories[0].reward == 0.75 and by_task[tasks[0].id].is_correct
    assert by_task[tasks[1].id].trajectories[0].reward == 1.0
    arith = load_cookbook("math-arith").with_options({"format_coef": 0.25})
    assert arith.evaluator.format_coef == 0.25 and arith.evaluator.digits_joined


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"format_coeff": 0.1}, r"unknown math option\(s\) \['format_coeff'\]; known: \['format_coef'\]"),
        ({"format_coef": 1.5}, "format_coef must be between 0 and 1, got 1.5"),
        ({"format_coef": "lots"}, "format_coef must be a number, got 'lots'"),
    ],
)
def test_a_bad_math_option_is_refused_naming_it(options, message):
    with pytest.raises(ValueError, match=message):
        load_cookbook("math").with_options(options)


def test_rllm_train_refuses_a_bad_format_coef_before_any_work(tmp_path):
    from rllm.engine.training.launch import load_train_config
    from rllm.types import ConfigError

    with pytest.raises(ConfigError, match=r"cookbook_options.*format_coef must be between 0 and 1"):
        load_train_config(
            "math", overrides=["cookbook_options.format_coef=-1"], out_dir=str(tmp_path / "run")
        )
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_two_training_steps(train, tmp_path):
    rows = train("math", tmp_path)
    assert all(row["episodes"] == 4 for row in rows)
