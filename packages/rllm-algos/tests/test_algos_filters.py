import pytest
from algos_helpers import episode

from rllm.algos import AlgorithmConfig, RewardError, filter_groups, group_trajectories
from rllm.types import TerminationReason


def _groups(spec: dict[str, list[float]], reasons: dict[str, list[TerminationReason]] | None = None):
    episodes = []
    for task, rewards in spec.items():
        for i, r in enumerate(rewards):
            reason = (reasons or {}).get(task, [TerminationReason.DONE] * len(rewards))[i]
            episodes.append(episode(task, {"solver": r}, index=i, reason=reason))
    return group_trajectories(episodes)


def test_zero_variance_groups_dropped_and_metrics() -> None:
    groups = _groups({"right": [1, 1, 1], "wrong": [0, 0, 0], "mixed": [1, 0, 1], "mixed2": [0.2, 0.5, 0.5]})
    kept, metrics = filter_groups(groups, AlgorithmConfig(filter_zero_variance=True))
    assert [g.task_id for g in kept] == ["mixed", "mixed2"]
    assert metrics["frac_all_correct"] == pytest.approx(0.5)  # "right" and "mixed2" (all > 0)
    assert metrics["frac_all_wrong"] == pytest.approx(0.25)
    assert metrics["frac_effective"] == pytest.approx(0.5)
    assert metrics["groups_zero_variance"] == 2
    assert metrics["groups_kept"] == 2


def test_zero_variance_groups_are_kept_by_default() -> None:
    """Off by default (as TRL, verl and tinker-cookbook): the groups train with advantage 0."""
    groups = _groups({"right": [1, 1], "mixed": [1, 0]})
    kept, metrics = filter_groups(groups, AlgorithmConfig())
    assert len(kept) == 2
    assert metrics["frac_effective"] == pytest.approx(0.5)


def test_mask_terminations_removes_members_before_size_and_reward_checks() -> None:
    T = TerminationReason
    groups = _groups(
        {"a": [1, 0, 1, 0], "b": [1, 0]},
        {"a": [T.DONE, T.TIMEOUT, T.DONE, T.AGENT_ERROR], "b": [T.DONE, T.INFRA_ERROR]},
    )
    config = AlgorithmConfig(
        mask_terminations=["timeout", "errors"], min_group_size=2, filter_zero_variance=False
    )
    kept, metrics = filter_groups(groups, config)
    assert [(g.task_id, len(g.trajectories)) for g in kept] == [("a", 2)]
    assert kept[0].termination_reasons == [T.DONE, T.DONE]
    assert len(groups[0].trajectories) == 4  # the input groups are not modified
    assert metrics["trajectories_masked"] == 3
    assert metrics["groups_too_small"] == 1


def test_masking_lets_unrewarded_failures_through() -> None:
    T = TerminationReason
    episodes = [
        episode("a", {"solver": 1.0}),
        episode("a", {"solver": 0.0}, index=1),
        episode("a", {"solver": None}, index=2, reason=T.AGENT_ERROR),
    ]
    with pytest.raises(RewardError, match="mixes"):
        filter_groups(group_trajectories(episodes), AlgorithmConfig())
    kept, _ = filter_groups(group_trajectories(episodes), AlgorithmConfig(mask_terminations=["agent_error"]))
    assert len(kept[0].trajectories) == 2


def test_everything_filtered_gives_empty_list_not_error() -> None:
    kept, metrics = filter_groups(_groups({"a": [1.0]}), AlgorithmConfig(min_group_size=2))
    assert kept == []
    assert metrics["groups_kept"] == 0


def test_turn_credit_keeps_groups_whose_turns_differ_under_equal_outcomes() -> None:
    """Two-turn rollouts with the same final reward but different first-turn rewards still teach
    under turn credit (and only there), so the zero-variance filter must keep them."""
    from rllm.algos import compute_advantages

    def two_turns(task: str, first: list[float], final: float = 1.0) -> list:
        episodes = [episode(task, {"solver": final}, index=i, steps=2) for i in range(len(first))]
        for ep, r in zip(episodes, first, strict=True):
            ep.trajectories[0].steps[0].reward = r
        return episodes

    episodes = two_turns("turns", [1.0, 0.0]) + two_turns("same", [1.0, 1.0])
    broadcast, _ = filter_groups(group_trajectories(episodes), AlgorithmConfig(filter_zero_variance=True))
    assert broadcast == []
    turn = AlgorithmConfig(step_credit="turn", gamma=0.0, filter_zero_variance=True)
    kept, metrics = filter_groups(group_trajectories(episodes), turn)
    assert [g.task_id for g in kept] == ["turns"] and metrics["frac_effective"] == pytest.approx(0.5)
    compute_advantages(kept, turn)
    first, second = kept[0].trajectories
    assert first.steps[0].advantage > 0 > second.steps[0].advantage  # the first turn is credited
    assert first.steps[1].advantage == second.steps[1].advantage == 0.0  # the second turn is not
    kept, _ = filter_groups(
        group_trajectories(episodes), AlgorithmConfig(estimator="turn", filter_zero_variance=True)
    )
    assert [g.task_id for g in kept] == ["turns"]  # the "turn" estimator implies turn credit
