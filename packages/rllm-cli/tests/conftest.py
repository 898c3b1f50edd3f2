"""Shared fixtures: a private $RLLM_HOME and a real loopback model server (MockUpstream)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rllm.testing import MockUpstream


def say_the_word(body: dict[str, Any]) -> str:
    """Answer 'say: WORD' with WORD, so the say cookbooks score 1 (and 'say: lemon' wrongly)."""
    content = body["messages"][-1].get("content") or ""
    word = content.rsplit(":", 1)[-1].strip()
    return "wrong" if word == "lemon" else word


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
