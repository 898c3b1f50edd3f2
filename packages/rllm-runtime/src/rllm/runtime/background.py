"""Run an asyncio service on a private event loop in a daemon thread, for synchronous callers.

The gateway, the mock upstream and the tinker sampler server all offer a blocking start/stop
next to their async one; this is the one place that owns the thread and loop for them.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable

from rllm.runtime.event_loop import new_event_loop
from rllm.types.errors import DeadlineError


class BackgroundLoop:
    """``start(setup, teardown)`` runs ``setup()`` on a new loop in a thread and returns when it has
    finished (re-raising its error); ``stop()`` runs ``teardown()`` there and joins the thread."""

    def __init__(self, name: str, *, use_uvloop: bool = False) -> None:
        self.name = name
        self.use_uvloop = use_uvloop
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(
        self,
        setup: Callable[[], Awaitable[object]],
        teardown: Callable[[], Awaitable[object]],
        timeout: float = 60.0,
    ) -> None:
        ready = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            loop = new_event_loop(self.use_uvloop)
            asyncio.set_event_loop(loop)
            self.loop = loop
            try:
                loop.run_until_complete(setup())
            except BaseException as exc:  # surfaced to the caller of start()
                errors.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            loop.run_forever()
            try:
                loop.run_until_complete(teardown())
            finally:
                loop.close()

        self._thread = threading.Thread(target=run, name=self.name, daemon=True)
        self._thread.start()
        if not ready.wait(timeout):
            raise DeadlineError(f"{self.name} did not start within {timeout} s")
        if errors:
            self._thread.join()
            self._thread = self.loop = None
            raise errors[0]

    def stop(self, timeout: float = 30.0) -> None:
        if self.loop is not None and self._thread is not None:
            if self.loop.is_running():
                self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout)
        self._thread = self.loop = None
