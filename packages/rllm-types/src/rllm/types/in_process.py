"""Servers answering in this process: the one register/unregister rule of their tables.

Two tables map an address to a server that answers calls in memory instead of over TCP:
``rllm.runtime.inprocess_upstreams`` (the gateway's upstreams, e.g. the embedded local sampler,
by base URL) and ``rllm.sdk.clients`` (the flows' openai clients' server, the engine's embedded
gateway, by event loop and origin). They sit in packages that do not import each other (the
sdk depends on rllm-types alone, so a cookbook installs nothing of the runtime), hence this
rule lives here, below both. Each table stays a plain dict, read with ``get`` on its hot path.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TypeVar

from rllm.types.errors import StateError

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


def serve_in(table: dict[K, V], key: K, server: V, where: str) -> Callable[[], None]:
    """Put ``server`` in ``table`` under ``key``; returns the function that takes it out again
    (call it before the server stops; it leaves a server registered later under the same key
    alone). A key already served is a StateError naming ``where`` (the address, as people read
    it): two servers for one address would split its calls silently."""
    if key in table:
        raise StateError(f"{where} is already served in process")
    table[key] = server

    def stop() -> None:
        if table.get(key) is server:
            del table[key]

    return stop


__all__ = ["serve_in"]
