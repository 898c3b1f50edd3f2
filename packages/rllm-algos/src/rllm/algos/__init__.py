"""rllm.algos: grouping, filters and advantage estimators on rllm-types (numpy only).

The torch policy losses live in ``rllm.algos.losses`` (install the ``torch`` extra); importing
this package never imports torch.
"""

from rllm.algos.advantages import compute_advantages
from rllm.algos.config import AlgorithmConfig
from rllm.algos.errors import AlgorithmInputError, RewardError
from rllm.algos.filters import filter_groups
from rllm.algos.grouping import group_rewards, group_trajectories, trajectory_reward
from rllm.algos.registry import (
    available_estimators,
    available_losses,
    get_estimator,
    get_loss,
    register_estimator,
    register_loss,
    unregister_estimator,
    unregister_loss,
)
from rllm.algos.reward_batch import RewardBatch
from rllm.types.errors import ConfigError

__all__ = [
    "AlgorithmConfig",
    "AlgorithmInputError",
    "ConfigError",
    "RewardBatch",
    "RewardError",
    "available_estimators",
    "available_losses",
    "compute_advantages",
    "filter_groups",
    "get_estimator",
    "get_loss",
    "group_rewards",
    "group_trajectories",
    "register_estimator",
    "register_loss",
    "trajectory_reward",
    "unregister_estimator",
    "unregister_loss",
]
