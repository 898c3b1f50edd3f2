"""The optimizer settings every Tinker-API service takes with each ``optim_step``."""

from __future__ import annotations

from typing import Any, Protocol


class AdamSettings(Protocol):
    """The optimizer fields of a Tinker-API backend's config."""

    learning_rate: float
    betas: tuple[float, float]
    eps: float
    weight_decay: float
    grad_clip: float


def adam_params(adam_params_type: Any, cfg: AdamSettings) -> Any:
    """``cfg`` as the service SDK's ``AdamParams`` (its own class passed in; a grad_clip <= 0 is
    sent as 0, which the services read as no clipping)."""
    return adam_params_type(
        learning_rate=cfg.learning_rate,
        beta1=cfg.betas[0],
        beta2=cfg.betas[1],
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        grad_clip_norm=max(cfg.grad_clip, 0.0),
    )
