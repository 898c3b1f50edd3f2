"""The figures a training step measures for the health checks, from what it already holds: its
episodes and its groups after advantages (no model pass; a few sums over the step's
completions: 6 ms of a 2 s main-job step on the 2-core machine at load 23,
benchmarks/health_overhead.py).

- ``tokens/entropy_proxy``: a proxy of the policy's token entropy, the mean of -logprob over the
  sampled completion tokens (the sampler's logprobs). A sampled token's -logprob is an unbiased estimate
  of the entropy of the distribution it was drawn from, so this tracks the sampling
  distribution's entropy (at temperature 1, the policy's) on every backend.
- ``tokens/truncated_share``: the share of model calls that stopped at ``max_tokens``
  (``finish_reason == "length"``).
- ``filter/no_signal_groups``: the share of groups that carry no learning signal (no rollout has a
  nonzero advantage) although their reward lies strictly between ``health.reward_floor`` and
  ``health.reward_ceiling``; ``filter/no_signal_reward`` is those groups' mean reward. Groups all
  at the floor are the unrewarded tasks every run starts with (``learning_watch`` names those that
  stay so); all at the ceiling, solved ones.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from rllm.algos.grouping import trajectory_reward
from rllm.engine.training.health_config import HealthSection
from rllm.types import Episode, Trajectory, TrajectoryGroup


def step_health_metrics(
    episodes: Sequence[Episode], groups: Sequence[TrajectoryGroup], section: HealthSection
) -> dict[str, float]:
    """The step's health figures (a figure with nothing to measure is left out)."""
    out: dict[str, float] = {}
    total, tokens, calls, cut = 0.0, 0, 0, 0
    for episode in episodes:
        for trajectory in episode.trajectories:
            for step in trajectory.steps:
                if step.completion_logprobs is not None and len(step.completion_logprobs):
                    total -= math.fsum(step.completion_logprobs)
                    tokens += len(step.completion_logprobs)
                if step.finish_reason is not None:
                    calls += 1
                    cut += step.finish_reason == "length"
    if tokens:
        out["tokens/entropy_proxy"] = total / tokens
    if calls:
        out["tokens/truncated_share"] = cut / calls
    if groups:
        silent = [r for g in groups if (r := _silent_reward(g, section)) is not None]
        out["filter/no_signal_groups"] = len(silent) / len(groups)
        if silent:
            out["filter/no_signal_reward"] = statistics.fmean(silent)
    return out


def _silent_reward(group: TrajectoryGroup, section: HealthSection) -> float | None:
    """The group's reward when none of its rollouts carries a learning signal and every one got
    the same reward strictly between the floor and the ceiling; else None."""
    if not group.trajectories or any(_has_signal(t) for t in group.trajectories):
        return None
    rewards = {trajectory_reward(t) for t in group.trajectories}
    if len(rewards) != 1:
        return None
    (reward,) = rewards
    if reward is None or not section.reward_floor < reward < section.reward_ceiling:
        return None
    return reward


def _has_signal(trajectory: Trajectory) -> bool:
    for step in trajectory.steps:
        advantage = step.advantage
        if advantage is None:
            continue
        if isinstance(advantage, int | float):
            if advantage != 0:
                return True
        elif any(a != 0 for a in advantage):  # one per token (a FloatArray)
            return True
    return False
