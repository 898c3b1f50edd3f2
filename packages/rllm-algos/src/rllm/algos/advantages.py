"""compute_advantages: rewards of TrajectoryGroups → ``Step.advantage`` on every step.

Groups are partitioned by role (trajectory name), because roles may use different estimators
and batch-level statistics should not mix a judge's reward scale with a solver's. Within a role,
one estimator call covers every group at once.

Step credit:
- ``broadcast``: each step of a trajectory gets the trajectory's advantage.
- ``turn``: step t gets the estimator applied to its discounted return-to-go
  ``G_t = r_t + gamma * G_{t+1}``, compared with the steps at the same turn index t of the other
  trajectories of its group ("comparable steps"). ``r_t`` is ``Step.reward`` (missing = 0) for
  earlier steps; the last step's ``r_T`` is its own ``Step.reward`` when the flow set one (a flow
  that rewards every step, as an environment's step rewards: the trajectory's reward is then the
  return they add up to), else the trajectory's resolved outcome reward.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rllm.algos.config import AlgorithmConfig
from rllm.algos.errors import AlgorithmInputError, RewardError
from rllm.algos.grouping import group_rewards
from rllm.algos.registry import EstimatorSpec, get_estimator, step_credit_for
from rllm.algos.reward_batch import RewardBatch
from rllm.types import Trajectory, TrajectoryGroup


def compute_advantages(groups: Sequence[TrajectoryGroup], config: AlgorithmConfig) -> dict[str, float]:
    """Write ``Step.advantage`` (a float) on every step of ``groups``; return summary metrics.

    No groups (everything filtered out) is a no-op returning ``{}``: there is nothing to write and
    nothing to train, and skipping the update is the caller's call. A group without trajectories
    is an AlgorithmInputError; a missing or non-finite reward a RewardError. Metric keys are
    unprefixed ("mean", "std", "min", "max", "<role>/mean", "<role>/std"); callers add a prefix.
    """
    if not groups:
        return {}
    by_role: dict[str, list[TrajectoryGroup]] = {}
    for group in groups:
        if not group.trajectories:
            raise AlgorithmInputError(
                f"group (task {group.task_id!r}, trajectory {group.role!r}) has no trajectories"
            )
        by_role.setdefault(group.role, []).append(group)

    metrics: dict[str, float] = {}
    all_adv: list[np.ndarray] = []
    for role, role_groups in by_role.items():
        spec = get_estimator(config.estimator_for(role))
        if step_credit_for(role, config) == "turn":
            adv = _turn_credit(role_groups, spec, config)
        else:
            adv = _broadcast_credit(role_groups, spec, config)
        all_adv.append(adv)
        metrics[f"{role}/mean"] = float(adv.mean()) if adv.size else 0.0
        metrics[f"{role}/std"] = float(adv.std()) if adv.size else 0.0
    flat = np.concatenate(all_adv)
    if not flat.size:  # turn-level credit over trajectories none of which has a turn
        return {**metrics, "mean": 0.0, "std": 0.0, "min": 0.0, "max": 0.0}
    metrics.update(
        {
            "mean": float(flat.mean()),
            "std": float(flat.std()),
            "min": float(flat.min()),
            "max": float(flat.max()),
        }
    )
    return metrics


def _broadcast_credit(
    groups: list[TrajectoryGroup], spec: EstimatorSpec, config: AlgorithmConfig
) -> np.ndarray:
    rewards, index = group_rewards(groups)
    tokens = np.fromiter(
        (_token_count(t) for g in groups for t in g.trajectories), dtype=np.float64, count=rewards.size
    )
    adv = _run(spec, RewardBatch(rewards, index, len(groups), tokens), config)
    row = 0
    for group in groups:
        for trajectory in group.trajectories:
            value = float(adv[row])
            for step in trajectory.steps:
                step.advantage = value
            row += 1
    return adv


def _turn_credit(groups: list[TrajectoryGroup], spec: EstimatorSpec, config: AlgorithmConfig) -> np.ndarray:
    outcome, traj_group = group_rewards(groups)
    trajectories = [t for g in groups for t in g.trajectories]
    lengths = np.fromiter((len(t.steps) for t in trajectories), dtype=np.int64, count=len(trajectories))
    # A trajectory with no turn (e.g. a rollout cut off before its first model call) has nothing to
    # credit and no turn to compare: it takes no cell, and its group's other turns still train.
    if not lengths.any():
        return np.zeros(0)
    n, width = len(trajectories), int(lengths.max())
    valid = np.arange(width)[None, :] < lengths[:, None]
    step_rewards = np.zeros((n, width))
    step_tokens = np.zeros((n, width))
    for i, trajectory in enumerate(trajectories):
        if not trajectory.steps:
            continue
        for t, step in enumerate(trajectory.steps[:-1]):
            if step.reward is not None:
                step_rewards[i, t] = step.reward
            step_tokens[i, t] = 0 if step.completion_ids is None else len(step.completion_ids)
        last = trajectory.steps[-1]
        step_tokens[i, lengths[i] - 1] = 0 if last.completion_ids is None else len(last.completion_ids)
        if last.reward is not None:  # every step rewarded: the last one by its own reward too
            outcome[i] = last.reward
    with_turns = np.flatnonzero(lengths)
    step_rewards[with_turns, lengths[with_turns] - 1] = outcome[with_turns]
    if not np.isfinite(step_rewards).all():
        i, t = (int(v) for v in np.argwhere(~np.isfinite(step_rewards))[0])
        raise RewardError(f"step {t} of trajectory {trajectories[i].id!r} has reward {step_rewards[i, t]}")
    # Returns-to-go: one vectorised pass per turn index (turns are few; groups may be many).
    returns = np.zeros_like(step_rewards)
    running = np.zeros(n)
    for t in range(width - 1, -1, -1):
        running = np.where(valid[:, t], step_rewards[:, t] + config.gamma * running, 0.0)
        returns[:, t] = running
    # Comparable steps: same group, same turn index.
    cell_group = (traj_group[:, None] * width + np.arange(width)[None, :])[valid]
    _, compact = np.unique(cell_group, return_inverse=True)
    compact = compact.reshape(-1)
    batch = RewardBatch(returns[valid], compact, int(compact.max()) + 1, step_tokens[valid])
    adv = np.zeros((n, width))
    adv[valid] = _run(spec, batch, config)
    for i, trajectory in enumerate(trajectories):
        for t, step in enumerate(trajectory.steps):
            step.advantage = float(adv[i, t])
    return adv[valid]


def _run(spec: EstimatorSpec, batch: RewardBatch, config: AlgorithmConfig) -> np.ndarray:
    adv = np.asarray(spec.fn(batch, config), dtype=np.float64)
    if adv.shape != batch.rewards.shape:
        raise AlgorithmInputError(
            f"estimator {spec.name!r} returned shape {adv.shape}, expected {batch.rewards.shape}"
        )
    if not np.isfinite(adv).all():
        raise AlgorithmInputError(f"estimator {spec.name!r} produced non-finite advantages")
    return adv


def _token_count(trajectory: Trajectory) -> int:
    return sum(0 if s.completion_ids is None else len(s.completion_ids) for s in trajectory.steps)
