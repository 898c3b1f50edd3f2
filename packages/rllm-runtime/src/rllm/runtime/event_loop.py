"""Run coroutines on uvloop where it is installed and wanted.

Every rollout is a few HTTP exchanges through the gateway, and with hundreds in flight the event
loop's own overhead (callbacks, socket reads and writes) is a large share of the engine's CPU;
uvloop does that work in C. Rollout worker processes and ``rllm train`` use it by default (a seeded
run of the whole-system benchmark gets the same reward at every step on either loop, with less CPU
on uvloop: benchmarks/history/issue-35.md, "#35 round 9"); ``rllm eval`` and ``rllm sft`` keep
asyncio's own loop unless asked. ``RLLM_UVLOOP=1`` / ``0`` turns it on / off everywhere.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def use_uvloop(default: bool = True) -> bool:
    """Whether to run on uvloop: ``RLLM_UVLOOP`` (1/0) if set, else ``default``; never when
    uvloop is not installed."""
    setting = os.environ.get("RLLM_UVLOOP", "").strip().lower()
    wanted = default if not setting else setting not in ("0", "false", "no", "off")
    if not wanted:
        return False
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def run(main: Coroutine[Any, Any, T], *, uvloop_default: bool = True) -> T:
    """``asyncio.run(main)``, on a uvloop event loop when :func:`use_uvloop` says so."""
    if use_uvloop(uvloop_default):
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)


def new_event_loop(uvloop: bool) -> asyncio.AbstractEventLoop:
    """A new event loop: uvloop's when asked for and installed, else asyncio's."""
    if uvloop:
        try:
            import uvloop as _uvloop

            return _uvloop.new_event_loop()
        except ImportError:  # e.g. Windows
            pass
    return asyncio.new_event_loop()
