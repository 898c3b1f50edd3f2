"""Rows of a Hugging Face hub dataset as plain dicts, for cookbooks' hub loaders.

Every cookbook ships a small offline sample and offers the full dataset from the hub for users
with network access. ``datasets`` is heavy and never needed offline, so it is imported only when a
hub split is asked for (the ``hub`` extra); rows come back as ``dict[str, Any]`` so a loader reads
columns without caring which of ``datasets``' container types it got.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rllm.types.errors import MissingExtraError


def hub_rows(name: str, config: str | None = None, *, split: str) -> Iterator[dict[str, Any]]:
    """Yield each row of ``name`` (``config``) ``split`` from the hub, in order."""
    try:
        from datasets import load_dataset
    except ImportError as exc:  # the message names the fix
        raise MissingExtraError(
            f"loading {name!r} from the hub needs `datasets`: pip install 'rllm-sdk[hub]'"
        ) from exc
    rows = load_dataset(name, config, split=split) if config else load_dataset(name, split=split)
    for row in rows:
        yield dict(row)  # type: ignore[arg-type] - a split iterates as column -> value mappings
