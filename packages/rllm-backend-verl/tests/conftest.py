"""Where verl is not installed (the workspace env), only the config tests are collected.

The rest run in ``nox -s verl``, with verl imported for real.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # verl_helpers.py (importlib mode adds no test dirs)

collect_ignore_glob = (
    []
    if importlib.util.find_spec("verl")
    else ["test_verl_engine_*.py", "test_verl_convert.py", "test_verl_trainer_config.py"]
)


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rllm.backends.verl.tiny import init_tiny_model

    return init_tiny_model(tmp_path_factory.mktemp("verl-tiny") / "model", seed=0)


def cpu_config(model: Path, **options: object):
    """A one-rank CPU config for verl's engine (micro-batches of 2, so a batch of 4 splits)."""
    from rllm.backends.verl.config import parse_config

    base = {
        "model": str(model),
        "cluster": {"device": "cpu"},
        "gradient_checkpointing": False,
        "micro_batch_size_per_gpu": 2,
        "log_prob_micro_batch_size_per_gpu": 2,
    }
    return parse_config({**base, **options})
