"""Supervised training on verl without a sampler (``rollout.engine = "none"``).

``rllm sft`` only trains: it never asks for inference URLs or syncs weights. With
``backend.options.rollout.engine = "none"`` the backend starts verl's worker group in the
``actor`` role alone (no vLLM/SGLang replica, no external server, no weight sync), so SFT runs on
the CPU as on GPUs; the loss is rllm.algos' ``cross_entropy`` inside verl's engine, over the
assistant tokens' loss mask, and the checkpoints are the usual verl ones (``rllm export``,
``rllm train --init-from``). Anything that needs a sampler is refused with the key to change.
"""

from __future__ import annotations

from rllm.algos.config import AlgorithmConfig
from rllm.algos.registry import get_loss
from rllm.types.errors import ConfigError

ENGINE_KEY = "backend.options.rollout.engine"
NEEDS_A_SAMPLER = (
    f"{ENGINE_KEY} = 'none' starts no sampler, so it runs supervised training (`rllm sft`) only; "
    "RL and distillation sample: set it to 'vllm', 'sglang' or 'external'"
)


def check_no_rollout(algo: AlgorithmConfig) -> None:
    """Before anything starts: without a sampler only a supervised loss without KL can train."""
    if not get_loss(algo.loss).supervised:
        raise ConfigError(f"loss {algo.loss!r}: {NEEDS_A_SAMPLER}", ENGINE_KEY)
    if algo.kl_coef > 0:
        # The reference policy lives in verl's actor_rollout_ref role, which builds a rollout.
        raise ConfigError(f"kl_coef > 0 needs the reference policy's workers: {NEEDS_A_SAMPLER}", ENGINE_KEY)


def no_sampler() -> ConfigError:
    """What asking a sampler-less backend for its servers raises (after start: RL with cross_entropy)."""
    return ConfigError(NEEDS_A_SAMPLER, ENGINE_KEY)


__all__ = ["ENGINE_KEY", "NEEDS_A_SAMPLER", "check_no_rollout", "no_sampler"]
