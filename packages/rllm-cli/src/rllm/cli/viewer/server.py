"""The viewer's HTTP server: stdlib ``ThreadingHTTPServer`` on loopback, one page and a JSON API.

GET /                               the page (index.html, no build step)
GET /api/run                        name, metric rows, steps with samples
GET /api/steps/STEP/episodes        the step's sampled episodes (summary rows)
GET /api/steps/STEP/episodes/INDEX  one episode: trajectories, messages, tokens
"""

from __future__ import annotations

import logging
import re
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any

from rllm.cli.viewer.data import RunView, to_json_bytes

log = logging.getLogger(__name__)

_EPISODES = re.compile(r"^/api/steps/(\d+)/episodes$")
_EPISODE = re.compile(r"^/api/steps/(\d+)/episodes/(\d+)$")


def page() -> bytes:
    return resources.files("rllm.cli.viewer").joinpath("index.html").read_bytes()


class ViewerServer:
    """Serves one RunView; ``start()`` runs it on a background thread, ``url`` says where."""

    def __init__(self, view: RunView, host: str = "127.0.0.1", port: int = 0) -> None:
        self.view = view
        handler = type("Handler", (_Handler,), {"view": view, "page": page()})
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/"

    def start(self) -> ViewerServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="rllm-viewer", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> ViewerServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Handler(BaseHTTPRequestHandler):
    view: RunView
    page: bytes
    server_version = "rllm-view"

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        try:
            if path in ("/", "/index.html"):
                self._send(HTTPStatus.OK, self.page, "text/html; charset=utf-8")
            elif path == "/api/run":
                self._json(self.view.run())
            elif m := _EPISODES.match(path):
                self._json(self.view.episodes(int(m[1])))
            elif m := _EPISODE.match(path):
                self._json(self.view.episode(int(m[1]), int(m[2])))
            else:
                self._error(HTTPStatus.NOT_FOUND, f"no such page: {path}")
        except KeyError as exc:
            self._error(HTTPStatus.NOT_FOUND, str(exc.args[0]) if exc.args else "not found")
        except Exception as exc:  # the page shows the reason instead of a dropped connection
            log.exception("viewer request %s failed", path)
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, f"{type(exc).__name__}: {exc}")

    def _json(self, payload: Any) -> None:
        self._send(HTTPStatus.OK, to_json_bytes(payload), "application/json")

    def _error(self, status: HTTPStatus, message: str) -> None:
        self._send(status, to_json_bytes({"error": message}), "application/json")

    def _send(self, status: HTTPStatus, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)
