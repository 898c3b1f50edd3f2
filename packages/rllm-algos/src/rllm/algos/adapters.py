"""LoraConfig: the LoRA adapter shape, declared once for a backend's options
(``backend.options.lora``) and for each of a run's policies (``policies.NAME.lora``,
rllm.engine.training.policies), so both spell and check its keys alike."""

from __future__ import annotations

from typing import Literal

import msgspec


class LoraConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """LoRA adapter shape. ``rank = 0`` means full fine-tuning (every weight trains)."""

    rank: int = 0
    alpha: float = 16.0
    dropout: float = 0.0
    # "all-linear" lets peft pick every linear layer except the output head.
    target_modules: list[str] | Literal["all-linear"] = "all-linear"


__all__ = ["LoraConfig"]
