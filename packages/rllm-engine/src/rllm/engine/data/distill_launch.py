"""The Trainer's distillation hook from its config: the teacher checked against the student's
tokenizer before anything starts (``rllm distill NAME --teacher URL``)."""

from __future__ import annotations

from rllm.engine.backend import Backend
from rllm.engine.data.distill import Distiller
from rllm.engine.training.trainer_config import TrainerConfig
from rllm.types import ConfigError


def build_distiller(config: TrainerConfig, backend: Backend) -> Distiller | None:
    if config.distill is None:
        return None
    path = backend.tokenizer_path()
    if not path:
        raise ConfigError.for_key(
            "distill.teacher",
            f"backend {config.backend.name!r} has no local tokenizer to check the teacher's against",
        )
    from rllm.gateway.cumulative import TokenBridge

    return Distiller(config.distill, TokenBridge.load(path).tokenizer)


__all__ = ["build_distiller"]
