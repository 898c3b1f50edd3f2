"""``file_lock``: one process at a time through a block, across processes (an advisory
``flock`` on a lock file), for filling a cache that several processes may ask for at once: the
model cache of ``backend.options.model = "x.gguf"`` and the test fixtures' real model."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if missing, never removed: removing it would
    let a waiter and a newcomer lock two different files) for the block. Waits for the holder;
    the kernel releases the lock when its holder exits, however it exits."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock
