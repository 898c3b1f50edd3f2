"""Built-in advantage estimators, each vectorised over every group of a role at once.

Conventions shared by the group-relative estimators: a group of one has nothing to compare
against, so its advantage is 0 (its reward is its own baseline). verl's loop implementations of
GRPO and RLOO return the raw score there instead; see tests/test_algos_verl_reference.py.
"""

from __future__ import annotations

import numpy as np

from rllm.algos.config import AlgorithmConfig
from rllm.algos.registry import register_estimator
from rllm.algos.reward_batch import RewardBatch

# Variance floor inside the square root when whitening a whole batch: keeps a constant batch at
# zero advantage instead of 0/0 (same value verl uses, so REINFORCE++-baseline matches it).
WHITEN_EPS = 1e-8


@register_estimator("grpo", group_baseline=True)
def grpo(batch: RewardBatch, config: AlgorithmConfig) -> np.ndarray:
    """(r - group mean) / (group std + epsilon), with the unbiased (n-1) std as in GRPO/verl."""
    centred = batch.rewards - batch.group_mean()
    return centred / (batch.group_std(ddof=1) + config.epsilon)


@register_estimator("drgrpo", group_baseline=True)
def drgrpo(batch: RewardBatch, config: AlgorithmConfig) -> np.ndarray:
    """r - group mean: Dr.GRPO drops the std division, which favours easy/hard prompts' noise."""
    return batch.rewards - batch.group_mean()


@register_estimator("rloo", group_baseline=True)
def rloo(batch: RewardBatch, config: AlgorithmConfig) -> np.ndarray:
    """r - mean of the *other* rewards of the group (leave-one-out baseline, unbiased)."""
    sizes = batch.group_sizes()[batch.group]
    others = np.maximum(sizes - 1.0, 1.0)
    loo_mean = (batch.group_sum(batch.rewards)[batch.group] - batch.rewards) / others
    return np.where(sizes > 1, batch.rewards - loo_mean, 0.0)


@register_estimator("reinforce")
def reinforce(batch: RewardBatch, config: AlgorithmConfig) -> np.ndarray:
    """The reward itself: plain REINFORCE, no baseline."""
    return batch.rewards.copy()


@register_estimator("reinforce_pp_baseline", group_baseline=True)
def reinforce_pp_baseline(batch: RewardBatch, config: AlgorithmConfig) -> np.ndarray:
    """REINFORCE++-baseline: subtract the group mean, then whiten over the whole batch.

    The whitening statistics are token-weighted (each row counts once per response token, with
    the unbiased n-1 variance) because the loss consumes one advantage per token.
    """
    return whiten(batch.rewards - batch.group_mean(), batch.token_counts)


@register_estimator("batch_norm")
def batch_norm(batch: RewardBatch, config: AlgorithmConfig) -> np.ndarray:
    """(r - batch mean) / (batch std + epsilon): no groups, for tasks sampled once each."""
    mean = batch.rewards.mean()
    std = batch.rewards.std(ddof=1) if batch.rewards.size > 1 else 0.0
    return (batch.rewards - mean) / (std + config.epsilon)


# "turn" is GRPO's normalisation applied per turn to discounted returns-to-go (see step_credit).
register_estimator("turn", step_credit="turn", group_baseline=True)(grpo)


def whiten(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """(v - weighted mean) / sqrt(unbiased weighted variance + WHITEN_EPS), weights = token counts."""
    total = weights.sum()
    mean = float((weights * values).sum() / total)
    centred = values - mean
    var = float((weights * centred * centred).sum() / (total - 1.0)) if total > 1.0 else 0.0
    return centred / np.sqrt(var + WHITEN_EPS)
