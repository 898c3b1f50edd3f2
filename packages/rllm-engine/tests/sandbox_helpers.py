"""Helpers for the sandbox tests: skip without bubblewrap, find host processes, wait on a condition."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import shutil
from collections.abc import AsyncIterator

import pytest

needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None or shutil.which("prlimit") is None,
    reason="bubblewrap (bwrap) and prlimit are not installed: apt-get install bubblewrap",
)


def host_processes_with(text: str) -> list[int]:
    """Host pids whose command line contains ``text``."""
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            pids.append(int(entry.name))
    return pids


@contextlib.asynccontextmanager
async def within(seconds: float, what: str) -> AsyncIterator[None]:
    """Fail (naming ``what`` and where every task of the loop is stuck) instead of hanging."""
    try:
        async with asyncio.timeout(seconds):
            yield
    except TimeoutError:
        stacks = io.StringIO()
        for task in asyncio.all_tasks():
            task.print_stack(limit=8, file=stacks)
        raise AssertionError(
            f"{what} did not finish within {seconds:g} s; tasks:\n{stacks.getvalue()}"
        ) from None
