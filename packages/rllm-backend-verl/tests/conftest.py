"""Test files that need verl skip where it is not installed (the workspace env); they run in
``nox -s verl``, with verl imported for real."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # verl_helpers.py (importlib mode adds no test dirs)


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rllm.tiny import init_tiny_model

    return init_tiny_model(tmp_path_factory.mktemp("verl-tiny") / "model", seed=0)
