"""Builders of small episodes for the rllm-algos tests."""

from __future__ import annotations

from rllm.types import Episode, Step, TerminationReason, Trajectory


def episode(
    task_id: str,
    rewards: dict[str, float | None],
    *,
    index: int = 0,
    steps: int = 1,
    tokens: int = 3,
    reason: TerminationReason = TerminationReason.DONE,
    step_rewards: bool = False,
) -> Episode:
    """One episode with a trajectory per role; rewards go on the trajectory (or the last step)."""
    trajectories = []
    for role, reward in rewards.items():
        body = [
            Step(completion_ids=list(range(tokens)), completion_logprobs=[-0.5] * tokens)
            for _ in range(steps)
        ]
        if step_rewards:
            body[-1].reward = reward
            trajectories.append(Trajectory(role=role, steps=body))
        else:
            trajectories.append(Trajectory(role=role, steps=body, reward=reward))
    return Episode(task_id=task_id, rollout_index=index, trajectories=trajectories, termination_reason=reason)
