"""A hub name that cannot be loaded from here, as a user meets it: `rllm doctor tokens ORG/NAME`,
`rllm sft hf:ORG/NAME` and `rllm dataset pull ORG/NAME` each end at once with one line naming the
name and the cause (offline, unreachable, not found) and exit 2: not a minute of the hub
libraries' retries, their warnings printed twice, or a traceback. Each command runs as a user runs
it (a subprocess) against an empty hub cache; the hub is offline by HF_HUB_OFFLINE, a loopback
port that refuses connections, or a real loopback HTTP server that knows no name. Nothing here
reaches the internet."""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest


class _EmptyHub(http.server.ThreadingHTTPServer):
    """A hub that knows no name: 404 for every request, each one counted."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _NotFound)
        self.paths: list[str] = []


class _NotFound(http.server.BaseHTTPRequestHandler):
    server: _EmptyHub

    def do_GET(self) -> None:
        self.server.paths.append(self.path)
        self.send_error(404)

    def do_HEAD(self) -> None:
        self.do_GET()

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass


@pytest.fixture
def empty_hub() -> Iterator[_EmptyHub]:
    hub = _EmptyHub()
    thread = threading.Thread(target=hub.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield hub
    hub.shutdown()
    hub.server_close()


@pytest.fixture
def refused_url() -> Iterator[str]:
    sock = socket.socket()  # bound, never listening: every connection is refused
    sock.bind(("127.0.0.1", 0))
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


def _rllm(tmp_path: Path, *args: str, **env: str) -> tuple[int, list[str]]:
    """Run `rllm ARGS` with an empty hub cache and rLLM home; (exit code, non-empty stderr lines)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_OFFLINE"))}
    base |= {
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_CACHE": str(tmp_path / "hf" / "hub"),
        "RLLM_HOME": str(tmp_path / "rllm-home"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "rllm.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=tmp_path,
        env=base | env,
    )
    return done.returncode, [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]


def test_doctor_on_a_hub_model_while_offline(tmp_path: Path) -> None:
    code, lines = _rllm(tmp_path, "doctor", "tokens", "rllm-test/no-model", HF_HUB_OFFLINE="1")
    assert code == 2, lines
    assert lines == [
        "error: hub model 'rllm-test/no-model': the hub is offline (HF_HUB_OFFLINE=1) and it is not in "
        "the local cache"
    ]


def test_sft_on_a_hub_dataset_with_the_hub_unreachable(tmp_path: Path, refused_url: str) -> None:
    out = tmp_path / "run"
    code, lines = _rllm(tmp_path, "sft", "hf:rllm-test/chats", "--out", str(out), HF_ENDPOINT=refused_url)
    assert code == 2, lines
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"error: hub dataset 'rllm-test/chats': {refused_url} is unreachable ("), lines
    assert "refused" in lines[0] and lines[0].endswith("and it is not in the local cache"), lines


def test_dataset_pull_of_a_name_the_hub_does_not_know(tmp_path: Path, empty_hub: _EmptyHub) -> None:
    url = f"http://127.0.0.1:{empty_hub.server_address[1]}"
    code, lines = _rllm(tmp_path, "dataset", "pull", "rllm-test/absent", "--split", "test", HF_ENDPOINT=url)
    assert code == 2, lines
    assert len(lines) == 1 and lines[0].startswith(
        f"error: hub dataset 'rllm-test/absent': not found on {url}"
    )
    assert empty_hub.paths == ["/api/datasets/rllm-test/absent"]  # asked once, no retries
    assert not (tmp_path / "rllm-home" / "datasets" / "absent").exists()
