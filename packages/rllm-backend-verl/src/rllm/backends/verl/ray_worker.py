"""The worker class Ray places: verl's ``ActorRolloutRefWorker`` and what a process needs first.

Ray starts each worker as a fresh process, so whatever verl must know before it builds anything
happens here, in the worker's own constructor: the CPU platform (``VERL_PLATFORM=cpu``, which
ray_cluster sets in the workers' environment) and the external rollout's registration. On the
CPU the gloo process group is made before verl's ``init_model`` asks for one, as in
``local_training_worker``.
"""

from __future__ import annotations

import os
from typing import Any

from rllm.backends.verl.cpu_platform import CPU_PLATFORM, init_cpu_process_group, use_cpu_platform
from rllm.backends.verl.external_rollout import register_external_rollout
from rllm.backends.verl.sft import engine_lr, set_engine_lr
from rllm.types.errors import StateError
from verl.single_controller.base.decorator import Dispatch, register
from verl.workers.engine_workers import ActorRolloutRefWorker


def on_cpu() -> bool:
    return os.environ.get("VERL_PLATFORM", "") == CPU_PLATFORM


class HybridWorker(ActorRolloutRefWorker):
    """verl's hybrid actor/rollout(/ref) worker, unchanged but for its process setup."""

    def __init__(self, config: Any, role: str, **kwargs: Any) -> None:
        if on_cpu():
            use_cpu_platform()
        register_external_rollout()
        super().__init__(config, role, **kwargs)

    # verl registers its Dispatch modes at import time (a dynamic enum), out of a type checker's sight.
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)  # pyright: ignore[reportAttributeAccessIssue]
    def init_model(self) -> None:
        if on_cpu():
            init_cpu_process_group()
        super().init_model()

    # `rllm sft`'s LR schedule (sft.py): each rank's actor optimizer, set before an update.
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)  # pyright: ignore[reportAttributeAccessIssue]
    def set_learning_rate(self, lr: float) -> float:
        return set_engine_lr(self._actor_engine(), lr)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)  # pyright: ignore[reportAttributeAccessIssue]
    def learning_rate(self) -> float:
        return engine_lr(self._actor_engine())

    def _actor_engine(self) -> Any:
        if self.actor is None:  # a reference-only worker has no optimizer
            raise StateError("this verl worker has no actor role, so no optimizer to set an LR on")
        return self.actor.engine
