"""Run one flow or evaluator call: async ones on the event loop, sync ones in a thread pool.

Deadlines: an async flow is cancelled when its deadline passes (its HTTP calls are aborted and
its ``finally`` blocks run). A sync flow cannot be force-killed in Python; when it misses its
deadline its result is discarded and the engine deletes its session, so any later call it makes
fails fast and it soon gives up its thread.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from rllm.types.errors import RLLMError


class DeadlineExceeded(RLLMError, TimeoutError):
    """The engine's deadline (not a timeout inside the flow) expired."""


async def call_with_deadline(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    *,
    is_async: bool,
    deadline_s: float | None,
    executor: Executor | None,
) -> Any:
    """``fn(*args)`` within ``deadline_s`` seconds; raises DeadlineExceeded when it runs over.

    A TimeoutError raised by the flow itself (its own client timeout) propagates unchanged, so
    it is not mistaken for the engine's deadline.
    """
    timeout = asyncio.timeout(deadline_s)
    try:
        async with timeout:
            if is_async:
                result = fn(*args)
            else:
                loop = asyncio.get_running_loop()
                ctx = contextvars.copy_context()
                result = await loop.run_in_executor(executor, functools.partial(ctx.run, fn, *args))
            if inspect.isawaitable(result):  # a sync callable that returned a coroutine
                result = await result
            return result
    except TimeoutError:
        if timeout.expired():
            raise DeadlineExceeded(f"exceeded its {deadline_s:g} s deadline") from None
        raise
