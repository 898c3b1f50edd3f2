import numpy as np
import pytest
from algos_helpers import episode

from rllm.algos import (
    AlgorithmConfig,
    AlgorithmInputError,
    compute_advantages,
    filter_groups,
    group_trajectories,
    register_estimator,
    unregister_estimator,
)
from rllm.types import Episode, Step, Trajectory, TrajectoryGroup


def test_broadcast_writes_every_step_per_role_estimators() -> None:
    episodes = [episode("t", {"solver": float(i % 2), "judge": float(i)}, index=i, steps=3) for i in range(4)]
    config = AlgorithmConfig(estimator="grpo", estimator_by_role={"judge": "reinforce"})
    metrics = compute_advantages(group_trajectories(episodes), config)
    solver = [e.trajectories[0] for e in episodes]
    std = np.std([0, 1, 0, 1], ddof=1)
    for i, trajectory in enumerate(solver):
        expected = (i % 2 - 0.5) / (std + 1e-6)
        assert [s.advantage for s in trajectory.steps] == pytest.approx([expected] * 3)
    assert [e.trajectories[1].steps[0].advantage for e in episodes] == [0.0, 1.0, 2.0, 3.0]
    assert metrics["judge/mean"] == pytest.approx(1.5)
    assert metrics["solver/mean"] == pytest.approx(0.0)


def test_many_groups_and_last_step_rewards() -> None:
    rng = np.random.default_rng(1)
    rewards = rng.random((30, 5))
    episodes = [
        episode(f"task{g}", {"solver": float(rewards[g, i])}, index=i, step_rewards=True)
        for g in range(30)
        for i in range(5)
    ]
    compute_advantages(group_trajectories(episodes), AlgorithmConfig(estimator="rloo"))
    got = np.array([e.trajectories[0].steps[0].advantage for e in episodes]).reshape(30, 5)
    expected = rewards - (rewards.sum(1, keepdims=True) - rewards) / 4
    np.testing.assert_allclose(got, expected, atol=1e-12)


def test_turn_credit_discounts_and_compares_same_turns() -> None:
    # Two trajectories of 3 turns with shaping rewards; outcome at the end.
    def traj(step_rewards, outcome):
        steps = [Step(completion_ids=[1, 2], reward=r) for r in step_rewards] + [Step(completion_ids=[1])]
        return Trajectory(role="solver", steps=steps, reward=outcome)

    a = Episode(task_id="t", trajectories=[traj([0.5, 0.0], 1.0)])
    b = Episode(task_id="t", trajectories=[traj([0.0, 0.0], 0.0)])
    c = Episode(
        task_id="t", rollout_index=2, trajectories=[Trajectory(role="solver", steps=[Step()], reward=0.5)]
    )
    gamma = 0.5
    compute_advantages(
        group_trajectories([a, b, c]), AlgorithmConfig(estimator="drgrpo", step_credit="turn", gamma=gamma)
    )
    returns_a = [0.5 + gamma * (0 + gamma * 1.0), gamma * 1.0, 1.0]
    returns_b = [0.0, 0.0, 0.0]
    # turn 0 compares a, b and c (c's only turn has return 0.5); later turns compare a and b.
    mean0 = (returns_a[0] + returns_b[0] + 0.5) / 3
    assert [s.advantage for s in a.trajectories[0].steps] == pytest.approx(
        [returns_a[0] - mean0, returns_a[1] / 2, returns_a[2] / 2]
    )
    assert [s.advantage for s in b.trajectories[0].steps] == pytest.approx(
        [-mean0, -returns_a[1] / 2, -returns_a[2] / 2]
    )
    assert c.trajectories[0].steps[0].advantage == pytest.approx(0.5 - mean0)


def test_turn_credit_takes_the_last_steps_own_reward_when_every_step_is_rewarded() -> None:
    """An environment's step rewards on every step, the trajectory's reward their sum (its
    return, what broadcast credit uses): under turn credit the last step is credited with its own
    reward, not the sum a second time; a last step without a reward still takes the outcome."""

    def traj(step_rewards):
        steps = [Step(completion_ids=[1], reward=r) for r in step_rewards]
        return Trajectory(role="solver", steps=steps, reward=sum(step_rewards))

    a = Episode(task_id="t", trajectories=[traj([0.5, 1.0])])
    b = Episode(task_id="t", rollout_index=1, trajectories=[traj([0.0, 0.0])])
    compute_advantages(group_trajectories([a, b]), AlgorithmConfig(estimator="drgrpo", step_credit="turn"))
    # returns-to-go: a [1.5, 1.0], b [0, 0]; drgrpo subtracts each turn's mean
    assert [s.advantage for s in a.trajectories[0].steps] == pytest.approx([0.75, 0.5])
    assert [s.advantage for s in b.trajectories[0].steps] == pytest.approx([-0.75, -0.5])
    broadcast = [traj([0.5, 1.0]), traj([0.0, 0.0])]
    episodes = [Episode(task_id="t", rollout_index=i, trajectories=[t]) for i, t in enumerate(broadcast)]
    compute_advantages(group_trajectories(episodes), AlgorithmConfig(estimator="drgrpo"))
    assert [s.advantage for s in broadcast[0].steps] == pytest.approx([0.75, 0.75])  # the return's

    nan = Episode(task_id="t", trajectories=[traj([0.0, float("nan")])])
    nan.trajectories[0].reward = 0.0
    with pytest.raises(Exception, match=r"step 1 of trajectory .* has reward nan"):
        compute_advantages(group_trajectories([nan, b]), AlgorithmConfig(step_credit="turn"))


def test_turn_credit_skips_a_trajectory_with_no_turn_and_trains_the_rest() -> None:
    """A rollout cut off before its first model call has no turn: it takes no cell (nothing to
    credit), the group's other turns are compared as if it were absent, and the step goes on."""

    def traj(outcome, turns):
        return Trajectory(
            role="solver", steps=[Step(completion_ids=[1]) for _ in range(turns)], reward=outcome
        )

    timed_out = Episode(task_id="t", rollout_index=2, trajectories=[traj(0.0, 0)])
    a = Episode(task_id="t", trajectories=[traj(1.0, 1)])
    b = Episode(task_id="t", rollout_index=1, trajectories=[traj(0.0, 1)])
    config = AlgorithmConfig(estimator="drgrpo", step_credit="turn")
    metrics = compute_advantages(group_trajectories([a, b, timed_out]), config)
    assert a.trajectories[0].steps[0].advantage == pytest.approx(0.5)
    assert b.trajectories[0].steps[0].advantage == pytest.approx(-0.5)
    assert metrics["max"] == pytest.approx(0.5)
    # A group none of whose rollouts got a turn: nothing to credit, no error.
    nothing = [Episode(task_id="u", rollout_index=i, trajectories=[traj(0.0, 0)]) for i in range(2)]
    assert compute_advantages(group_trajectories(nothing), config)["mean"] == 0.0


def test_turn_estimator_name_forces_turn_credit() -> None:
    episodes = [episode("t", {"solver": float(i)}, index=i, steps=2) for i in range(3)]
    compute_advantages(group_trajectories(episodes), AlgorithmConfig(estimator="turn", gamma=0.5))
    first = [e.trajectories[0].steps[0].advantage for e in episodes]
    last = [e.trajectories[0].steps[1].advantage for e in episodes]
    # returns at turn 0 are half those at turn 1; GRPO normalisation makes them equal (up to eps).
    np.testing.assert_allclose(first, last, atol=1e-5)
    assert last[2] > 0 > last[0]


def test_custom_registered_estimator_is_used() -> None:
    @register_estimator("times_two_test")
    def times_two(batch, config):
        return batch.rewards * 2

    try:
        episodes = [episode("t", {"solver": 1.5})]
        compute_advantages(group_trajectories(episodes), AlgorithmConfig(estimator="times_two_test"))
        assert episodes[0].trajectories[0].steps[0].advantage == 3.0
    finally:
        unregister_estimator("times_two_test")


def test_estimator_returning_nan_is_refused() -> None:
    @register_estimator("nan_test")
    def bad(batch, config):
        return batch.rewards * np.nan

    try:
        with pytest.raises(AlgorithmInputError, match=r"nan_test.*non-finite"):
            compute_advantages(
                group_trajectories([episode("t", {"solver": 1.0})]), AlgorithmConfig(estimator="nan_test")
            )
    finally:
        unregister_estimator("nan_test")


def test_no_groups_is_a_no_op_but_an_empty_group_is_an_error() -> None:
    assert compute_advantages([], AlgorithmConfig()) == {}
    with pytest.raises(AlgorithmInputError, match=r"task 't'.*no trajectories"):
        compute_advantages([TrajectoryGroup(task_id="t", role="solver")], AlgorithmConfig())


def test_pipeline_group_filter_advantages() -> None:
    episodes = [
        episode(f"t{g}", {"solver": float((g + i) % 3 == 0)}, index=i) for g in range(6) for i in range(4)
    ]
    kept, metrics = filter_groups(group_trajectories(episodes), AlgorithmConfig())
    compute_advantages(kept, AlgorithmConfig())
    kept_ids = {id(t) for g in kept for t in g.trajectories}
    for e in episodes:
        t = e.trajectories[0]
        assert (t.steps[0].advantage is not None) == (id(t) in kept_ids)
    assert metrics["groups_kept"] == len(kept)
