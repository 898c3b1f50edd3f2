"""Which inputs a backend trains on: text always; images only where the backend says so.

A backend that trains on images (their pixels reach its model beside the placeholder tokens)
declares it with ``validate_images()``, which may still refuse for some of its options (the
tinker backend: its local service yes, the remote one no). A backend without it, or whose check
refuses, never gets a batch with images: ``refuse_images`` stops the step before the backend
sees it, since training on image placeholder tokens without their pixels would silently train
on garbage. The capability matrix's modality rows ask the same check.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rllm.types import TrainSequence
from rllm.types.errors import ConfigError


def check_images(backend: Any) -> None:
    """ConfigError unless ``backend`` trains on images (it has ``validate_images`` and it passes)."""
    name = getattr(backend, "name", type(backend).__name__)
    validate = getattr(backend, "validate_images", None)
    if validate is None:
        raise ConfigError.for_key(
            "backend.name",
            f"backend {name!r} does not train on images (only text): its model would see the image "
            "placeholder tokens without their pixels; use a backend whose capability matrix row "
            "'images' reads yes (docs/capabilities.md)",
        )
    try:
        validate()
    except ValueError as exc:
        raise ConfigError.for_key(
            "backend.name", f"backend {name!r} does not train on images here: {exc}"
        ) from None


def refuse_images(backend: Any, batch: Sequence[TrainSequence]) -> None:
    """``check_images`` when a sequence of ``batch`` carries images; nothing for text batches."""
    if any(sequence.images for sequence in batch):
        check_images(backend)


def trains_on_images(backend: Any) -> bool:
    """Whether ``backend`` takes batches with images (the capability matrix's probe)."""
    try:
        check_images(backend)
    except ConfigError:
        return False
    return True
