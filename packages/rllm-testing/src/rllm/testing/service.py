"""What the fakes of remote services share: the contract error, and an aiohttp app served on its
own thread and event loop (``LoopbackFake`` gives a fake its start/stop/``with``).

The official SDKs (tinker, fireworks-ai) block their caller in some calls (creating a session,
polling a control plane), so a fake they talk to must not share the test's event loop. Needs
aiohttp, imported by the fakes that use this module.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Self

from aiohttp import web

from rllm.types.errors import RLLMError


class ContractError(RLLMError, ValueError):
    """A request that breaks the contract between an SDK and its service (answered with 400)."""


class ServiceThread:
    """Serve the app ``make_app()`` builds on 127.0.0.1 (a free port) from a daemon thread.

    ``start()`` returns the base URL once the server listens; ``stop()`` shuts it down.
    """

    def __init__(self, name: str, make_app: Callable[[], web.Application], *, auto_decompress: bool = True):
        self.name = name
        self.url = ""
        self._make_app = make_app
        self._auto_decompress = auto_decompress
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._failed: BaseException | None = None

    def start(self, timeout: float = 10.0) -> str:
        ready = threading.Event()

        def run() -> None:
            loop = self._loop = asyncio.new_event_loop()
            try:
                loop.run_until_complete(self._serve())
            except BaseException as exc:  # handed to start(), which raises it in the caller
                self._failed = exc
                ready.set()
                loop.close()
                return
            ready.set()
            loop.run_forever()

        self._thread = threading.Thread(target=run, name=self.name, daemon=True)
        self._thread.start()
        if not ready.wait(timeout):
            raise RuntimeError(f"{self.name} did not start within {timeout} s")
        if self._failed is not None:
            raise RuntimeError(f"{self.name} failed to start: {self._failed!r}") from self._failed
        return self.url

    async def _serve(self) -> None:
        # access_log=None: a fake's log lines would only bury the test's own output.
        self._runner = web.AppRunner(self._make_app(), auto_decompress=self._auto_decompress, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    def stop(self, timeout: float = 10.0) -> None:
        loop = self._loop
        if loop is None or self._failed is not None:
            return
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), loop).result(timeout)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout)
        self._loop = None


class LoopbackFake:
    """A fake served by the ServiceThread in ``_service``: ``start()``/``stop()``, or ``with``."""

    _service: ServiceThread

    @property
    def url(self) -> str:
        """The service's base URL (empty until started)."""
        return self._service.url

    def start(self) -> str:
        return self._service.start()

    def stop(self) -> None:
        self._service.stop()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
