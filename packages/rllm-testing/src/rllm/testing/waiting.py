"""Waiting on state in tests: polling, for what offers no event to wait on (a host process, a
file, a counter in another thread); and on a line a child process writes (its pipe is the event).
The timeout only turns a hang into a failure naming what was awaited; it is generous so a cold,
busy machine passes."""

from __future__ import annotations

import asyncio
import inspect
import os
import selectors
import subprocess
import time
from collections.abc import Awaitable, Callable

# How often the condition is read again: short, so a test goes on as soon as the state is there.
POLL_INTERVAL_S = 0.005


async def wait_until(
    condition: Callable[[], bool | Awaitable[bool]], timeout_s: float = 30.0, what: str = "condition"
) -> None:
    """Poll ``condition`` (a function, or a coroutine function: e.g. an admin call) until it
    holds; AssertionError naming ``what`` after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await _holds(condition):
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        await asyncio.sleep(POLL_INTERVAL_S)


async def _holds(condition: Callable[[], bool | Awaitable[bool]]) -> bool:
    result = condition()
    return bool(await result) if inspect.isawaitable(result) else bool(result)


def read_until_line(
    proc: subprocess.Popen[bytes], prefix: str, timeout_s: float = 300.0, what: str | None = None
) -> list[str]:
    """The lines a child process wrote to its stderr pipe (``stderr=subprocess.PIPE``, bytes) up
    to and including the first that starts with ``prefix``. Waits on the pipe (select), so the
    test goes on the moment the line is written; AssertionError naming ``what`` (default: the
    line) with what was read when the process exits first or after ``timeout_s``."""
    assert proc.stderr is not None, "read_until_line needs stderr=subprocess.PIPE"
    fd = proc.stderr.fileno()
    deadline = time.monotonic() + timeout_s
    lines: list[str] = []
    pending = b""
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not selector.select(left):
                raise AssertionError(
                    f"timed out after {timeout_s:g} s waiting for {what or repr(prefix)}; stderr so far:\n"
                    + "\n".join(lines)
                )
            chunk = os.read(fd, 65536)
            if not chunk:
                raise AssertionError(
                    f"the process closed stderr (exit code {proc.wait()}) before {what or repr(prefix)}:\n"
                    + "\n".join(lines)
                    + pending.decode(errors="replace")
                )
            *complete, pending = (pending + chunk).split(b"\n")
            for raw in complete:
                lines.append(raw.decode(errors="replace"))
                if lines[-1].startswith(prefix):
                    return lines
