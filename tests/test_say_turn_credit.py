"""The say cookbook credits each turn with its own word (its evaluator plus its training defaults'
``step_credit="turn"``, ``gamma=0``): two rollouts with the same total but different turns
right and wrong must not cancel out, and a wrong word must not share the other turn's credit."""

from __future__ import annotations

from rllm.algos import AlgorithmConfig, compute_advantages, filter_groups, group_trajectories
from rllm.engine.plugins import load_cookbook
from rllm.engine.rollout.scoring import apply_eval_output
from rllm.types import Episode, Step, Task, TerminationReason, Trajectory


def _scored(task: Task, replies: list[str], index: int) -> Episode:
    steps = [Step(completion_ids=[1, 2], completion_logprobs=[-0.5, -0.5]) for _ in replies]
    episode = Episode(
        task_id=task.id,
        rollout_index=index,
        trajectories=[Trajectory(role="default", steps=steps)],
        artifacts={"replies": replies},
        termination_reason=TerminationReason.DONE,
    )
    cookbook = load_cookbook("say")
    apply_eval_output(episode, cookbook.evaluator.evaluate(task, episode))
    return episode


def test_each_turn_is_credited_with_its_own_word() -> None:
    cookbook = load_cookbook("say")
    task = next(t for t in cookbook.load_tasks("train") if t.metadata["words"] == ["apple", "river"])
    first_right = _scored(task, ["apple", "stone"], 0)
    second_right = _scored(task, ["lemon", "river"], 1)
    assert first_right.metrics["reward"] == second_right.metrics["reward"] == 0.5  # reported: the fraction
    assert first_right.trajectories[0].steps[0].reward == 1.0
    assert first_right.trajectories[0].reward == 0.0  # the last turn's own reward

    config = AlgorithmConfig(**cookbook.train_defaults["algorithm"])
    groups = group_trajectories([first_right, second_right])
    kept, _ = filter_groups(groups, config)
    compute_advantages(kept, config)
    (a, b) = (e.trajectories[0].steps for e in (first_right, second_right))
    assert a[0].advantage > 0 > a[1].advantage  # "apple" rewarded, "stone" for "river" not
    assert b[0].advantage < 0 < b[1].advantage
