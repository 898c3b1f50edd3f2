"""Run the engine's coroutines on uvloop where it is installed.

Every rollout is a few HTTP exchanges through the gateway, and with hundreds in flight the event
loop's own overhead (callbacks, socket reads and writes) is a large share of the engine's CPU;
uvloop does that work in C. ``RLLM_UVLOOP=0`` keeps the standard loop (e.g. for a debugger that
needs it).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def use_uvloop() -> bool:
    """True when uvloop is importable and not switched off with RLLM_UVLOOP=0."""
    if os.environ.get("RLLM_UVLOOP", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)``, on a uvloop event loop when :func:`use_uvloop` says so."""
    if use_uvloop():
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)
