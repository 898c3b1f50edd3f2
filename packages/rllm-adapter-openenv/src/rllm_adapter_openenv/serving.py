"""An OpenEnv FastAPI app (openenv-core's ``create_app``) served on loopback by uvicorn.

``serve("pkg.module:attr")`` starts the app once per process, in a daemon thread, and returns its
``http://127.0.0.1:PORT`` (the port is bound and listening before the thread starts, so a client
connecting at once waits in the backlog: nothing polls for it). A forked worker starts its own.

``python -m rllm_adapter_openenv.serving pkg.module:attr [--port N]`` serves one in the foreground
(printing ``ready http://127.0.0.1:PORT`` once listening): a shared server for ``openenv:URL``.
``--uds PATH`` serves it on a unix socket instead (``ready unix:PATH``): how an environment runs
inside a rollout's sandbox (:mod:`rllm_adapter_openenv.sandboxed`).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import socket
import sys
import threading
from typing import Any

from rllm.types.errors import InputError, LookupFailed

_served: dict[tuple[int, str], str] = {}
_lock = threading.Lock()


def load_app(path: str) -> Any:
    """The ASGI app ``module:attr`` names (``module`` alone: its ``app``)."""
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise LookupFailed(
                f"no OpenEnv environment app {path!r}: module {exc.name!r} is not installed"
            ) from None
        raise
    app = getattr(module, attr or "app", None)
    if app is None or not callable(app):
        raise InputError(f"{module_name} has no OpenEnv app {attr or 'app'!r} (an app from create_app)")
    return app


def _listening_socket(port: int = 0) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(256)
    return sock


class _SessionCloseNoise(logging.Filter):
    """Drops the one ASGI error openenv-core's ``/ws`` endpoint logs on every normal session end
    (it closes a socket the client has already closed: a ``WebSocketDisconnect``); every other
    error of the server is logged as usual."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return type(exc).__name__ != "WebSocketDisconnect"


def _server(app: Any) -> Any:
    import uvicorn

    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _SessionCloseNoise) for f in logger.filters):
        logger.addFilter(_SessionCloseNoise())
    return uvicorn.Server(uvicorn.Config(app, log_level="warning"))


def serve(path: str) -> str:
    """The loopback URL of app ``path``, served in this process from the first call on."""
    key = (os.getpid(), path)
    with _lock:
        url = _served.get(key)
        if url is not None:
            return url
        app = load_app(path)
        sock = _listening_socket()
        server = _server(app)
        thread = threading.Thread(
            target=lambda: asyncio.run(server.serve(sockets=[sock])), name=f"openenv:{path}", daemon=True
        )
        thread.start()
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        _served[key] = url
        return url


def main(argv: list[str]) -> None:
    if not argv or len(argv) not in (1, 3) or (len(argv) == 3 and argv[1] not in ("--port", "--uds")):
        sys.exit("usage: python -m rllm_adapter_openenv.serving pkg.module:attr [--port N | --uds PATH]")
    server = _server(load_app(argv[0]))
    if len(argv) == 3 and argv[1] == "--uds":  # inside a sandbox: a unix socket the host connects to
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(argv[2])
        sock.listen(256)
        print(f"ready unix:{argv[2]}", flush=True)
    else:
        sock = _listening_socket(int(argv[2]) if len(argv) == 3 else 0)
        print(f"ready http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    asyncio.run(server.serve(sockets=[sock]))


if __name__ == "__main__":
    main(sys.argv[1:])
