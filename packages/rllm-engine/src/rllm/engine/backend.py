"""The Backend protocol: what a training backend offers the engine's Trainer.

A backend owns model weights: it serves them for inference (OpenAI-compatible upstream URLs the
gateway routes to), applies optimizer steps to advantage-weighted token sequences with the loss
from ``rllm.algos``, syncs new weights to its samplers and saves/loads checkpoints. Everything
else (rollouts, grouping, advantages, filtering, logging, validation and checkpoint cadence)
lives once, in the Trainer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import msgspec

from rllm.algos.config import AlgorithmConfig
from rllm.types import FloatArray, TokenArray


class TrainSequence(msgspec.Struct, kw_only=True):
    """One token sequence to train on (a single-turn step, or merged turns of one segment).

    All arrays align with ``tokens``: the value at index i concerns token i, which the model
    predicts from ``tokens[:i]``. ``loss_mask`` is 1 for tokens the policy sampled and 0 for
    prompt, tool-output and observation tokens, which never contribute to the loss. ``images``
    are the data URIs of the images whose placeholder tokens appear in ``tokens``, in order: a
    vision-language backend turns them into the same pixel inputs sampling used.
    """

    tokens: TokenArray
    loss_mask: FloatArray
    advantages: FloatArray
    sampler_logprobs: FloatArray
    group_id: str = ""
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    images: list[str] = msgspec.field(default_factory=list)


@runtime_checkable
class Backend(Protocol):
    """A training backend. Discovered through the ``rllm.backends`` entry point."""

    name: str

    def validate(self, algo: AlgorithmConfig) -> None:
        """Raise ValueError naming every algorithm option this backend cannot honour."""
        ...

    async def start(self) -> None:
        """Load the model, start samplers; after this ``inference_urls`` are reachable."""
        ...

    def inference_urls(self) -> list[str]:
        """OpenAI-compatible base URLs (ending in /v1) serving the current weights."""
        ...

    def served_model_name(self) -> str:
        """The model name agents should send."""
        ...

    def tokenizer_path(self) -> str | None:
        """A local tokenizer path for the gateway's token-level (cumulative) mode, if any."""
        ...

    async def train_step(self, batch: list[TrainSequence], algo: AlgorithmConfig) -> dict[str, float]:
        """forward_backward over mini-batches of ``batch`` and one optimizer step; returns metrics."""
        ...

    async def sync_weights(self) -> int:
        """Push the trained weights to the samplers; returns the new weight version."""
        ...

    async def save_checkpoint(self, path: Path) -> None:
        """Save model and optimizer state under ``path`` (a directory)."""
        ...

    async def load_checkpoint(self, path: Path) -> None:
        """Restore what ``save_checkpoint`` wrote."""
        ...

    async def close(self) -> None:
        """Stop samplers and free resources."""
        ...
