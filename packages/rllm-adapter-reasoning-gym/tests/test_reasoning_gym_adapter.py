"""The reasoning-gym adapter against the real reasoning-gym: its generators' own entries as tasks,
its own scorer as the evaluator, `rllm eval reasoning-gym:NAME` end to end against a scripted
loopback model (rllm.testing's MockUpstream), and every refusal in one line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import reasoning_gym
from click.testing import CliRunner
from rllm_adapter_reasoning_gym import cookbook_for, generators, reasoning_gym_scorer

from rllm.cli.main import cli
from rllm.testing import MockUpstream
from rllm.types import Episode
from rllm.types.errors import InputError, LookupFailed


def test_the_tasks_are_the_generators_own_entries_with_the_difficulty_asked_for() -> None:
    cookbook = cookbook_for("leg_counting", {"size": 6, "test_size": 3, "max_animals": 2, "min_animals": 2})
    train, test = cookbook.load_tasks("train"), cookbook.load_tasks("test")
    reference = reasoning_gym.create_dataset("leg_counting", seed=1, size=6, max_animals=2, min_animals=2)
    assert [(t.instruction, t.ground_truth) for t in train] == [
        (e["question"], e["answer"]) for e in reference
    ]
    assert all(len(e["metadata"]["animals"]) == 2 for e in reference)
    assert len(test) == 3 and not {t.instruction for t in test} & {t.instruction for t in train}
    with pytest.raises(InputError, match="splits 'train' and 'test'"):
        cookbook.load_tasks("validation")


async def test_the_evaluator_is_the_generators_score_answer() -> None:
    (task,) = cookbook_for("basic_arithmetic", {"size": 1}).load_tasks("train")
    dataset = reasoning_gym.create_dataset("basic_arithmetic", seed=1, size=1)
    right = await reasoning_gym_scorer.evaluate(
        task, Episode(task_id=task.id, artifacts={"answer": task.ground_truth})
    )
    wrong = await reasoning_gym_scorer.evaluate(task, Episode(task_id=task.id, artifacts={"answer": "-0.5x"}))
    untagged = await reasoning_gym_scorer.evaluate(task, Episode(task_id=task.id, artifacts={"answer": None}))
    assert (right.reward, right.is_correct) == (1.0, True)
    assert (
        wrong.reward == dataset.score_answer(answer="-0.5x", entry=dataset[0]) < 1.0 and not wrong.is_correct
    )
    assert untagged.reward == 0.0 and {s.name: s.value for s in untagged.signals}["answer_tagged"] == 0.0


def test_rllm_eval_runs_a_generator_against_a_model(tmp_path: Path) -> None:
    """Half the tasks answered right (in reasoning-gym's answer tags), half wrong."""
    tasks = cookbook_for("leg_counting", {"test_size": 4}).load_tasks("test")
    answers = {t.instruction: str(t.ground_truth) for t in tasks}
    right = {t.instruction for t in tasks[::2]}

    def responder(body: dict) -> str:
        question = body["messages"][-1]["content"]
        assert "<answer>" in body["messages"][0]["content"]  # reasoning-gym's own system prompt
        return f"Counting... <answer>{answers[question] if question in right else '1'}</answer>"

    server = MockUpstream(responder=responder).start_in_thread()
    try:
        out = tmp_path / "eval"
        args = ["eval", "reasoning-gym:leg_counting", "--base-url", server.url, "--out", str(out)]
        result = CliRunner().invoke(cli, [*args, "--option", "test_size=4", "--no-progress"])
    finally:
        server.stop_in_thread()
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_tasks"] == 4 and summary["accuracy"] == 0.5


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["reasoning-gym:no_such_generator"], "reasoning-gym has no generator 'no_such_generator'"),
        (["reasoning-gym:leg_counting", "--option", "legs=3"], r"takes no option \['legs'\]"),
        (["reasoning-gym:leg_counting", "--option", "min_animals=0"], "min_animals must be positive"),
        (["reasoning-gym:leg_counting", "--option", "size=0"], "size must be a whole number >= 1"),
    ],
)
def test_bad_input_is_refused_in_one_line_before_any_rollout(
    args: list[str], message: str, tmp_path: Path
) -> None:
    result = CliRunner().invoke(
        cli, ["eval", *args, "--base-url", "http://127.0.0.1:9/v1", "--out", str(tmp_path)]
    )
    assert result.exit_code != 0 and re.search(message, result.output), result.output
    assert not (tmp_path / "summary.json").exists()


def test_an_unsupported_reasoning_gym_version_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    assert generators._in_range("0.1.25") and not generators._in_range("0.1.18")
    monkeypatch.setattr(generators, "version", lambda name: "0.3.0")
    with pytest.raises(generators.UnsupportedVersion, match=r"reasoning-gym 0\.3\.0 is not supported"):
        cookbook_for("leg_counting")
    monkeypatch.undo()
    with pytest.raises(LookupFailed):
        cookbook_for("nope")
