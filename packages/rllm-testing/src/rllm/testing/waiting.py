"""Waiting on state in tests: for what offers no event to wait on (a host process, a file, a
counter in another thread). The timeout only turns a hang into a failure naming what was
awaited; it is generous so a cold, busy machine passes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

# How often the condition is read again: short, so a test goes on as soon as the state is there.
POLL_INTERVAL_S = 0.005


async def wait_until(condition: Callable[[], bool], timeout_s: float = 30.0, what: str = "condition") -> None:
    """Poll ``condition`` until it holds; AssertionError naming ``what`` after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        await asyncio.sleep(POLL_INTERVAL_S)
