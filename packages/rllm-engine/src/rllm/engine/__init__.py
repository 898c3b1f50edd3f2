"""rllm.engine: rollouts through the gateway, episodes from traces, evaluation, and the Trainer.

``RolloutEngine`` runs a flow n times per task behind the gateway and returns Episodes;
``evaluate`` writes per-task results and pass@k; ``Trainer`` is the backend-agnostic training
loop over the ``Backend`` protocol (backends are found through the ``rllm.backends`` entry point).

The names below load on first use (PEP 562): importing any ``rllm.engine.*`` module runs this
file first, and the `rllm` command imports small ones (``plugins``, ``training.metrics_log``) before it
knows whether the command trains; loading the Trainer, the gateway and numpy eagerly here made
every `rllm --help` pay for them.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rllm.engine.backend import Backend, TrainSequence
    from rllm.engine.evaluation import evaluate
    from rllm.engine.rollout.rollout_config import RolloutConfig
    from rllm.engine.rollout.rollout_engine import RolloutEngine
    from rllm.engine.training.launch import build_trainer
    from rllm.engine.training.trainer import Trainer, TrainResult
    from rllm.engine.training.trainer_config import TrainerConfig, load_config
    from rllm.types import ConfigError

# public name -> the module that defines it
_LAZY = {
    "Backend": "rllm.engine.backend",
    "ConfigError": "rllm.types",
    "RolloutConfig": "rllm.engine.rollout.rollout_config",
    "RolloutEngine": "rllm.engine.rollout.rollout_engine",
    "TrainResult": "rllm.engine.training.trainer",
    "TrainSequence": "rllm.engine.backend",
    "Trainer": "rllm.engine.training.trainer",
    "TrainerConfig": "rllm.engine.training.trainer_config",
    "build_trainer": "rllm.engine.training.launch",
    "evaluate": "rllm.engine.evaluation",
    "load_config": "rllm.engine.training.trainer_config",
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


# Modules that moved into subpackages (training/, rollout/, data/) in 0.x: the old flat path still
# imports, as the same module object, with a DeprecationWarning naming the new one. Remove after
# one release.
MOVED_MODULES: dict[str, str] = {
    "agent_protocol": "rollout.agent_protocol",
    "agent_server": "rollout.agent_server",
    "async_loop": "training.async_loop",
    "async_rollouts": "training.async_rollouts",
    "chat_data": "data.chat_data",
    "chat_sources": "data.chat_sources",
    "checkpoint": "training.checkpoint",
    "data_order": "training.data_order",
    "distill": "data.distill",
    "distill_launch": "data.distill_launch",
    "distill_topk": "data.distill_topk",
    "early_flow_processes": "rollout.early_flow_processes",
    "episode_builder": "rollout.episode_builder",
    "eval_dispatch": "rollout.eval_dispatch",
    "executors": "rollout.executors",
    "failures": "rollout.failures",
    "flow_processes": "rollout.flow_processes",
    "flow_runner": "rollout.flow_runner",
    "init_from": "training.init_from",
    "launch": "training.launch",
    "learning_watch": "training.learning_watch",
    "loop_lag": "rollout.loop_lag",
    "metrics_log": "training.metrics_log",
    "mismatch": "training.mismatch",
    "own_gateway": "rollout.own_gateway",
    "prefetch": "training.prefetch",
    "ray_cancels": "rollout.ray_cancels",
    "ray_executor": "rollout.ray_executor",
    "remote_executor": "rollout.remote_executor",
    "rollout_config": "rollout.rollout_config",
    "rollout_engine": "rollout.rollout_engine",
    "rollout_progress": "rollout.rollout_progress",
    "run_folder": "training.run_folder",
    "scoring": "rollout.scoring",
    "sequences": "training.sequences",
    "sft": "data.sft",
    "sft_launch": "data.sft_launch",
    "staleness": "training.staleness",
    "tb_events": "training.tb_events",
    "trace_data": "data.trace_data",
    "train_progress": "training.train_progress",
    "train_step": "training.train_step",
    "trainer": "training.trainer",
    "trainer_config": "training.trainer_config",
    "warm_start": "training.warm_start",
    "worker_metrics": "rollout.worker_metrics",
}


class _MovedModuleLoader(importlib.abc.Loader):
    """Loads an old module path as the module at its new path (one object, two names)."""

    def __init__(self, new_name: str) -> None:
        self.new_name = new_name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{spec.name} moved to {self.new_name}; import it from there",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(self.new_name)

    def exec_module(self, module: ModuleType) -> None:
        """The module at the new path is already executed."""


class _MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Finds ``rllm.engine.OLD`` for every OLD in ``MOVED_MODULES``."""

    def find_spec(
        self, fullname: str, path: Any = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        parent, _, leaf = fullname.rpartition(".")
        new = MOVED_MODULES.get(leaf) if parent == __name__ else None
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _MovedModuleLoader(f"{__name__}.{new}"))


if not any(isinstance(finder, _MovedModuleFinder) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModuleFinder())


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rllm.engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
