"""rllm.engine: rollouts through the gateway, episodes from traces, evaluation, and the Trainer.

``RolloutEngine`` runs a flow n times per task behind the gateway and returns Episodes;
``evaluate`` writes per-task results and pass@k; ``Trainer`` is the backend-agnostic training
loop over the ``Backend`` protocol (backends are found through the ``rllm.backends`` entry point).

The names below load on first use (PEP 562): importing any ``rllm.engine.*`` module runs this
file first, and the `rllm` command imports small ones (``plugins``, ``metrics_log``) before it
knows whether the command trains; loading the Trainer, the gateway and numpy eagerly here made
every `rllm --help` pay for them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rllm.engine.backend import Backend, TrainSequence
    from rllm.engine.evaluation import evaluate
    from rllm.engine.launch import build_trainer
    from rllm.engine.rollout_config import RolloutConfig
    from rllm.engine.rollout_engine import RolloutEngine
    from rllm.engine.trainer import Trainer, TrainResult
    from rllm.engine.trainer_config import TrainerConfig, load_config
    from rllm.types import ConfigError

# public name -> the module that defines it
_LAZY = {
    "Backend": "rllm.engine.backend",
    "ConfigError": "rllm.types",
    "RolloutConfig": "rllm.engine.rollout_config",
    "RolloutEngine": "rllm.engine.rollout_engine",
    "TrainResult": "rllm.engine.trainer",
    "TrainSequence": "rllm.engine.backend",
    "Trainer": "rllm.engine.trainer",
    "TrainerConfig": "rllm.engine.trainer_config",
    "build_trainer": "rllm.engine.launch",
    "evaluate": "rllm.engine.evaluation",
    "load_config": "rllm.engine.trainer_config",
}

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


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rllm.engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
