"""rllm.engine: rollouts through the gateway, episodes from traces, evaluation, and the Trainer.

``RolloutEngine`` runs a flow n times per task behind the gateway and returns Episodes;
``evaluate`` writes per-task results and pass@k; ``Trainer`` is the backend-agnostic training
loop over the ``Backend`` protocol (backends are found through the ``rllm.backends`` entry point).
"""

from rllm.engine.backend import Backend, TrainSequence
from rllm.engine.evaluation import evaluate
from rllm.engine.launch import build_trainer
from rllm.engine.rollout_config import RolloutConfig
from rllm.engine.rollout_engine import RolloutEngine
from rllm.engine.trainer import Trainer, TrainResult
from rllm.engine.trainer_config import TrainerConfig, load_config
from rllm.types import ConfigError

__all__ = [
    "Backend",
    "ConfigError",
    "RolloutConfig",
    "RolloutEngine",
    "TrainResult",
    "TrainSequence",
    "Trainer",
    "TrainerConfig",
    "build_trainer",
    "evaluate",
    "load_config",
]
