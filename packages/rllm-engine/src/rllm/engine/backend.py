"""The Backend protocol: what a training backend offers the engine's Trainer.

A backend owns model weights: it serves them for inference (OpenAI-compatible upstream URLs the
gateway routes to), applies optimizer steps to advantage-weighted token sequences with the loss
from ``rllm.algos``, syncs new weights to its samplers and saves/loads checkpoints. Everything
else (rollouts, grouping, advantages, filtering, logging, validation and checkpoint cadence)
lives once, in the Trainer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

from rllm.algos.config import AlgorithmConfig
from rllm.types import TrainSequence

__all__ = ["Backend", "TrainSequence"]  # TrainSequence moved to rllm.types; re-exported for old imports


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
