import pytest
from algos_helpers import episode

from rllm.algos import AlgorithmConfig, AlgorithmInputError, RewardError, group_rewards, group_trajectories
from rllm.types import Episode, Step, TerminationReason, Trajectory


def test_groups_by_task_and_role_in_first_seen_order() -> None:
    episodes = [
        episode("a", {"solver": 1.0, "judge": 0.0}, index=0),
        episode("b", {"solver": 0.0}, index=0),
        episode("a", {"solver": 0.0, "judge": 1.0}, index=1, reason=TerminationReason.TIMEOUT),
    ]
    groups = group_trajectories(episodes, AlgorithmConfig())
    assert [(g.task_id, g.role, len(g.trajectories)) for g in groups] == [
        ("a", "solver", 2),
        ("a", "judge", 2),
        ("b", "solver", 1),
    ]
    assert groups[0].episode_ids == [episodes[0].id, episodes[2].id]
    assert groups[0].termination_reasons == [TerminationReason.DONE, TerminationReason.TIMEOUT]
    assert (
        groups[0].trajectories[1] is episodes[2].trajectories[0]
    )  # no copies: advantages land on the episodes


def test_rejects_non_episodes() -> None:
    with pytest.raises(AlgorithmInputError, match="Episode"):
        group_trajectories([{"task_id": "a"}])  # type: ignore[list-item]


def test_reward_resolution_prefers_trajectory_then_last_step() -> None:
    steps = [Step(reward=5.0), Step(reward=0.25)]
    episodes = [
        Episode(task_id="t", trajectories=[Trajectory(steps=steps, reward=1.0)]),
        Episode(task_id="t", trajectories=[Trajectory(steps=[Step(reward=5.0), Step(reward=0.25)])]),
    ]
    rewards, index = group_rewards(group_trajectories(episodes))
    assert rewards.tolist() == [1.0, 0.25]
    assert index.tolist() == [0, 0]


def test_missing_reward_names_episode_and_trajectory() -> None:
    ep = Episode(task_id="t", trajectories=[Trajectory(role="solver", steps=[Step()])])
    with pytest.raises(RewardError, match=rf"episode '{ep.id}' trajectory 'solver'.*neither"):
        group_rewards(group_trajectories([ep]))


def test_mixed_group_is_reported_as_mixed() -> None:
    good = episode("t", {"solver": 1.0})
    bad = episode("t", {"solver": None}, index=1, reason=TerminationReason.AGENT_ERROR)
    with pytest.raises(RewardError, match=rf"mixes rewarded and unrewarded.*{bad.id}.*mask_terminations"):
        group_rewards(group_trajectories([good, bad]))


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_reward_is_an_error(value: float) -> None:
    ep = episode("t", {"solver": value})
    with pytest.raises(RewardError, match=rf"{ep.id}.*finite"):
        group_rewards(group_trajectories([ep]))
