"""check_hub_name, the one answer every command gets before a hub library is asked for a name:
cached names pass without a request, offline and unreachable hubs and unknown names are refused
in one line naming the name and the cause, after one request at most. The hub is a real loopback
HTTP server (or a loopback port that refuses connections); nothing here reaches the internet."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rllm.runtime.hub_names import HubNameError, check_hub_name, is_hub_name


class _Hub(http.server.ThreadingHTTPServer):
    def __init__(self, status: int) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.status = status
        self.paths: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Hub

    def do_GET(self) -> None:
        self.server.paths.append(self.path)
        self.send_response(self.server.status)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass


@pytest.fixture
def hub_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty hub cache, online, no token: what every test starts from."""
    cache = tmp_path / "hub-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "HF_TOKEN"):
        monkeypatch.delenv(variable, raising=False)
    return cache


def _serve(status: int) -> Iterator[_Hub]:
    hub = _Hub(status)
    thread = threading.Thread(target=hub.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield hub
    hub.shutdown()
    hub.server_close()


@pytest.fixture
def hub_200() -> Iterator[_Hub]:
    yield from _serve(200)


@pytest.fixture
def hub_404() -> Iterator[_Hub]:
    yield from _serve(404)


@pytest.fixture
def hub_503() -> Iterator[_Hub]:
    yield from _serve(503)


@pytest.fixture
def closed_port() -> Iterator[str]:
    sock = socket.socket()  # bound, never listening: every connection is refused
    sock.bind(("127.0.0.1", 0))
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


def test_offline_and_not_cached_is_refused_without_a_request(
    hub_env: Path, hub_200: _Hub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", hub_200.url)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(
        HubNameError, match=r"hub model 'org/absent': the hub is offline \(HF_HUB_OFFLINE=1\)"
    ):
        check_hub_name("org/absent", "model")
    assert hub_200.paths == []


def test_a_cached_name_passes_offline(hub_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (hub_env / "models--org--here" / "snapshots" / "abc123").mkdir(parents=True)
    check_hub_name("org/here", "model")
    with pytest.raises(HubNameError):  # a model's cache entry is not the dataset's
        check_hub_name("org/here", "dataset")
    prepared = hub_env.parent / "datasets-cache"
    (prepared / "org___here").mkdir(parents=True)  # what `datasets` prepared into its cache_dir
    check_hub_name("org/here", "dataset", cache_dirs=[prepared])


def test_one_request_then_not_found(hub_env: Path, hub_404: _Hub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", hub_404.url)
    with pytest.raises(
        HubNameError, match=rf"hub dataset 'org/absent': not found on {hub_404.url} \(HTTP 404"
    ):
        check_hub_name("org/absent", "dataset")
    assert hub_404.paths == ["/api/datasets/org/absent"]


def test_an_answering_hub_lets_the_name_through(
    hub_env: Path, hub_200: _Hub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", hub_200.url + "/")
    check_hub_name("org/there", "model")
    assert hub_200.paths == ["/api/models/org/there"]


def test_a_failing_hub_is_unreachable(hub_env: Path, hub_503: _Hub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", hub_503.url)
    with pytest.raises(HubNameError, match=r"is unreachable \(HTTP 503\)"):
        check_hub_name("org/x", "model")


def test_a_refused_connection_is_unreachable(
    hub_env: Path, closed_port: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", closed_port)
    with pytest.raises(HubNameError, match=rf"hub model 'org/x': {closed_port} is unreachable \(.*refused"):
        check_hub_name("org/x", "model")


def test_local_paths_are_never_asked_about(
    hub_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "org" / "model").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    check_hub_name("org/model", "model")  # a folder here, though it has a hub name's form
    check_hub_name("./nowhere/at/all", "model")  # not a hub name: the loader reports the path


@given(st.text(max_size=40))
def test_paths_and_urls_are_never_hub_names(text: str) -> None:
    for name in (f"/{text}", f"./{text}", f"~/{text}", f"a/b/{text}", f"http://h/{text}", f"{text}/../x"):
        assert not is_hub_name(name)


@given(
    st.from_regex(
        r"[A-Za-z0-9][A-Za-z0-9_-]{0,20}/[A-Za-z0-9][A-Za-z0-9_.-]{0,20}[A-Za-z0-9]", fullmatch=True
    )
)
def test_org_slash_name_is_a_hub_name(name: str) -> None:
    if ".." in name:  # the hub's own rule: no ".." in a repo id (hypothesis found "0/0..0")
        assert not is_hub_name(name)
    else:
        assert is_hub_name(name) or Path(name).exists()
