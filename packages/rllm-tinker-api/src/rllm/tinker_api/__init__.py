"""rllm.tinker_api: what every Tinker-API backend shares (datums, loss plan, custom loss, batching, optimizer settings)."""

from rllm.tinker_api.batching import split_mini_batches
from rllm.tinker_api.custom_loss import make_custom_loss
from rllm.tinker_api.datums import to_datums
from rllm.tinker_api.losses import (
    BUILTIN_LOSSES,
    LossPlan,
    plan_loss,
    token_weights,
    unsupported_algo_options,
)
from rllm.tinker_api.optim import adam_params

__all__ = [
    "BUILTIN_LOSSES",
    "LossPlan",
    "adam_params",
    "make_custom_loss",
    "plan_loss",
    "split_mini_batches",
    "to_datums",
    "token_weights",
    "unsupported_algo_options",
]
