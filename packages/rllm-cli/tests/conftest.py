"""Shared fixtures: a private $RLLM_HOME and a real loopback model server (MockUpstream)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rllm.testing import MockUpstream, say_back

# Answers 'say: WORD' with WORD, so the say cookbooks score 1 (and 'say: lemon' wrongly).
say_the_word = say_back(wrong_when=lambda messages, word: word == "lemon")


@pytest.fixture
def rllm_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "rllm-home"
    monkeypatch.setenv("RLLM_HOME", str(home))
    return home


@pytest.fixture
def model_server() -> Iterator[MockUpstream]:
    server = MockUpstream(responder=say_the_word).start_in_thread()
    yield server
    server.stop_in_thread()
