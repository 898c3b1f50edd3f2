"""The optimizer settings every Tinker-API service takes with each ``optim_step``."""

from __future__ import annotations

from typing import Any

from rllm.algos.optim import AdamWSettings


def adam_params(adam_params_type: Any, cfg: AdamWSettings) -> Any:
    """``cfg`` (a backend config: its AdamW settings are rllm.algos' AdamWSettings) as the service
    SDK's ``AdamParams`` (its own class passed in; a grad_clip <= 0 is sent as 0, which the
    services read as no clipping)."""
    return adam_params_type(
        learning_rate=cfg.learning_rate,
        beta1=cfg.betas[0],
        beta2=cfg.betas[1],
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        grad_clip_norm=max(cfg.grad_clip, 0.0),
    )
