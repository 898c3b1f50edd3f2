"""A corrupting proxy in front of the local sampler (the token-truth tests): the gateway's
upstream answers with wrong completion token ids, text and logprobs untouched."""

from __future__ import annotations

import json
import sys
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from rllm.backends.tinker import TinkerBackend


class _QuietOnHangUp(ThreadingHTTPServer):
    """A stopping run hangs up on its in-flight sampler calls (the asynchronous loop has some when
    the mismatch check fires); socketserver would print each BrokenPipe's traceback to stderr,
    which is the stream the test reads for the run's own one-line reason."""

    def handle_error(self, request: object, client_address: object) -> None:
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return
        super().handle_error(request, client_address)  # pyright: ignore[reportArgumentType]


class _CorruptingProxy:
    """Forwards to the real sampler; answers with each completion token id replaced by the next id
    of the vocabulary, text and logprobs untouched (a router or parser that lost the ids); only
    the answers to requests for model ``only`` when given (one policy's sampler of several)."""

    def __init__(self, upstream: str, vocab: int, only: str | None = None) -> None:
        target = urlsplit(upstream)
        root = f"{target.scheme}://{target.netloc}"

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self, body: bytes | None) -> None:
                request = urllib.request.Request(
                    root + self.path,
                    data=body,
                    method=self.command,
                    headers={"Content-Type": "application/json"},
                )
                with urllib.request.urlopen(request, timeout=120) as answer:
                    data = answer.read()
                    status = answer.status
                    kind = answer.headers.get("Content-Type", "application/json")
                asked = json.loads(body).get("model") if body else None
                if kind.startswith("application/json") and only in (None, asked):
                    payload = json.loads(data)
                    for choice in payload.get("choices", []) if isinstance(payload, dict) else []:
                        if choice.get("token_ids"):
                            choice["token_ids"] = [(t + 1) % vocab for t in choice["token_ids"]]
                    data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._forward(None)

            def do_POST(self) -> None:
                self._forward(self.rfile.read(int(self.headers.get("Content-Length", "0"))))

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = _QuietOnHangUp(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class CorruptedSamplerBackend(TinkerBackend):
    """The local backend whose gateway upstream is the corrupting proxy (``only``: corrupting
    the answers for that model name alone)."""

    proxy: _CorruptingProxy | None = None
    only: str | None = None

    def inference_urls(self) -> list[str]:
        if self.proxy is None:
            vocab = len(self.service.tokenizer)  # pyright: ignore[reportAttributeAccessIssue]
            self.proxy = _CorruptingProxy(super().inference_urls()[0], vocab, self.only)
        return [self.proxy.url]

    async def close(self) -> None:
        if self.proxy is not None:
            self.proxy.close()
            self.proxy = None
        await super().close()
