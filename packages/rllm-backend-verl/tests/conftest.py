"""Where verl is not installed (the workspace env), only the config tests are collected.

The rest run in ``nox -s verl``, with verl imported for real.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # verl_helpers.py (importlib mode adds no test dirs)

collect_ignore_glob = (
    []
    if importlib.util.find_spec("verl")
    else ["test_verl_engine_*.py", "test_verl_convert.py", "test_verl_trainer_config.py"]
)


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rllm.backends.verl.tiny import init_tiny_model

    return init_tiny_model(tmp_path_factory.mktemp("verl-tiny") / "model", seed=0)
