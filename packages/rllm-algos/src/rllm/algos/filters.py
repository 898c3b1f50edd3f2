"""Filters on TrajectoryGroups: mask failed rollouts, drop small and zero-variance groups.

A group whose rewards are all equal gives every member advantage 0 under a group-relative
estimator. With ``filter_zero_variance`` (off by default) such groups are dropped, which changes
the update (see AlgorithmConfig); without it they are kept (the local backend, with several
updates a batch, leaves their zero-advantage sequences out of the updates' passes, counting them
in the loss's denominators only).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rllm.algos.config import AlgorithmConfig
from rllm.algos.grouping import group_rewards
from rllm.algos.registry import step_credit_for
from rllm.types import TrajectoryGroup


def filter_groups(
    groups: Sequence[TrajectoryGroup], config: AlgorithmConfig
) -> tuple[list[TrajectoryGroup], dict[str, float]]:
    """Apply the filters of ``config`` in order and return (kept groups, metrics).

    1. Trajectories whose episode ended with a reason in ``mask_terminations`` leave their group
       (they neither train nor serve as a baseline). Needs ``TrajectoryGroup.termination_reasons``
       (filled by ``group_trajectories``); a group without them is treated as all "done".
    2. Groups with fewer than ``min_group_size`` trajectories are dropped.
    3. Rewards are resolved (a clear RewardError when one is missing).
    4. With ``filter_zero_variance``, groups whose rewards are all equal are dropped (under turn
       credit only when their earlier steps' rewards and their lengths are all equal too).

    Metrics (fractions over the groups that reach step 3): ``frac_all_correct`` (every reward
    > 0), ``frac_all_wrong`` (every reward <= 0), ``frac_effective`` (rewards differ: the group
    carries a learning signal); plus counts of input, kept, masked and dropped. Keys are
    unprefixed; callers add one (the Trainer logs them under ``filter/``).
    """
    masked_reasons = config.masked_termination_reasons()
    total = len(groups)
    n_masked = 0
    sized: list[TrajectoryGroup] = []
    n_small = 0
    for group in groups:
        if masked_reasons and group.termination_reasons:
            keep = [i for i, r in enumerate(group.termination_reasons) if r not in masked_reasons]
            n_masked += len(group.trajectories) - len(keep)
            if len(keep) < len(group.trajectories):
                group = _subset(group, keep)
        if len(group.trajectories) < max(config.min_group_size, 1):
            n_small += 1
            continue
        sized.append(group)

    metrics: dict[str, float] = {
        "groups_in": float(total),
        "trajectories_masked": float(n_masked),
        "groups_too_small": float(n_small),
    }
    if not sized:
        metrics.update(
            {
                "groups_kept": 0.0,
                "groups_zero_variance": 0.0,
                "frac_all_correct": 0.0,
                "frac_all_wrong": 0.0,
                "frac_effective": 0.0,
            }
        )
        return [], metrics

    rewards, index = group_rewards(sized)
    n = len(sized)
    # Per-group min/max in one pass each: ufunc.at over the flat rewards.
    lo = np.full(n, np.inf)
    hi = np.full(n, -np.inf)
    np.minimum.at(lo, index, rewards)
    np.maximum.at(hi, index, rewards)
    all_correct = lo > 0.0
    all_wrong = hi <= 0.0
    varied = hi > lo
    for i, group in enumerate(sized):
        # Under turn credit, equal outcomes can still differ turn by turn: that is signal too.
        if not varied[i] and step_credit_for(group.role, config) == "turn":
            varied[i] = _turns_differ(group)
    kept = (
        [g for g, v in zip(sized, varied, strict=True) if v] if config.filter_zero_variance else list(sized)
    )
    metrics.update(
        {
            "groups_kept": float(len(kept)),
            "groups_zero_variance": float(n - int(varied.sum())),
            "frac_all_correct": float(all_correct.mean()),
            "frac_all_wrong": float(all_wrong.mean()),
            "frac_effective": float(varied.mean()),
        }
    )
    return kept, metrics


def _turns_differ(group: TrajectoryGroup) -> bool:
    """Whether the group's trajectories differ in length or in an earlier step's reward."""
    shapes = {
        tuple(0.0 if s.reward is None else float(s.reward) for s in t.steps[:-1]) for t in group.trajectories
    }
    return len(shapes) > 1


def _subset(group: TrajectoryGroup, keep: list[int]) -> TrajectoryGroup:
    return TrajectoryGroup(
        task_id=group.task_id,
        role=group.role,
        trajectories=[group.trajectories[i] for i in keep],
        episode_ids=[group.episode_ids[i] for i in keep] if group.episode_ids else [],
        termination_reasons=[group.termination_reasons[i] for i in keep],
    )
