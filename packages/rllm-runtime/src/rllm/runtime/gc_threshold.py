"""Fewer garbage-collector passes in processes that serve many concurrent requests.

Hundreds of concurrent agents allocate container objects fast (HTTP clients, JSON, traces), and many
live for a whole rollout or sit in a trace store. With CPython's default young-generation threshold
(700) the collector then runs thousands of times a second and promotes those objects into the old
generation, whose full passes walk every object in the process (the profile:
benchmarks/history/issue-14.md, "Figures moved out of code comments"). A higher threshold keeps the
same collector with far fewer passes, for a few MB of extra young objects. The rollout engine raises
it while it runs (``RolloutConfig.gc_gen0_threshold``); ``rllm-gateway serve`` for its whole process
(``GatewayConfig.gc_gen0_threshold``). An embedded gateway leaves its host's collector alone.
"""

from __future__ import annotations

import gc


def raise_gc_threshold(gen0: int | None) -> tuple[int, int, int] | None:
    """Raise the young-generation threshold to ``gen0`` (never lower it; leave a disabled
    collector alone). Returns the thresholds to restore, or None when nothing changed."""
    previous = gc.get_threshold()
    if gen0 is None or not gc.isenabled() or previous[0] == 0 or previous[0] >= gen0:
        return None
    gc.set_threshold(gen0, *previous[1:])
    return previous


def restore_gc_threshold(previous: tuple[int, int, int] | None) -> None:
    """Undo :func:`raise_gc_threshold` (a no-op for None)."""
    if previous is not None:
        gc.set_threshold(*previous)
