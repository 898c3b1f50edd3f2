"""Gradient checkpointing for the local trainer: decoder layers keep only their input for backward
and recompute the rest, on the trainer's thread only.

transformers' own switch (``gradient_checkpointing_enable``) acts when a layer is in training
mode, which also turns dropout on (training logprobs would then differ from the sampler's) and,
on a module the sampler shares (``sampler_weights = "shared"``), drops the sampler's KV cache.
Here each decoder layer (transformers' ``GradientCheckpointingLayer``) gets a subclass whose call
runs ``torch.utils.checkpoint`` (non-reentrant, so frozen inputs such as LoRA's base embeddings
need no ``requires_grad``) only while the calling thread is inside :func:`recomputing` with
gradients on; every other call is the layer's own. The model stays in eval mode.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

_state = threading.local()
_CACHE_ARGUMENTS = ("past_key_values", "past_key_value", "layer_past")
_SUBCLASSES: dict[type, type] = {}


class _Recomputed:
    """Mixed in before a decoder layer's class (see :func:`install`)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        call = super().__call__  # pyright: ignore[reportAttributeAccessIssue]
        if getattr(_state, "on", False) and torch.is_grad_enabled():
            # A KV cache the layer appends to would differ when recomputed (transformers drops it
            # too); the trainer never passes one.
            for name in _CACHE_ARGUMENTS:
                if kwargs.get(name) is not None:
                    kwargs[name] = None
            if kwargs.get("use_cache"):
                kwargs["use_cache"] = False
            return checkpoint(call, *args, use_reentrant=False, preserve_rng_state=False, **kwargs)
        return call(*args, **kwargs)


def _decoder_layer_type() -> type | None:
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer
    except ImportError:  # transformers < 4.52 has no common decoder-layer class
        return None
    return GradientCheckpointingLayer


def install(model: torch.nn.Module) -> int:
    """Make every decoder layer of ``model`` able to recompute; returns how many there are
    (0: this model, or this transformers, offers no checkpointable layers)."""
    base = _decoder_layer_type()
    if base is None:
        return 0
    count = 0
    for module in model.modules():
        if not isinstance(module, base):
            continue
        count += 1
        cls = type(module)
        if issubclass(cls, _Recomputed):
            continue
        if cls not in _SUBCLASSES:
            _SUBCLASSES[cls] = type(cls.__name__, (_Recomputed, cls), {"__module__": cls.__module__})
        module.__class__ = _SUBCLASSES[cls]
    return count


@contextmanager
def recomputing(enabled: bool) -> Iterator[None]:
    """Within the block, this thread's forward passes with gradients recompute the installed
    layers in backward (``enabled``) or keep their activations (not)."""
    before = getattr(_state, "on", False)
    _state.on = enabled
    try:
        yield
    finally:
        _state.on = before


__all__ = ["install", "recomputing"]
