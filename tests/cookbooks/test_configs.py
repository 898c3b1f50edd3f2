"""Every cookbook ships a config per backend, and each is a valid TrainerConfig layered on the
cookbook's defaults (tinker ones also valid tinker backend options)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from rllm.backends.tinker.config import parse_config
from rllm.engine.plugins import load_cookbook
from rllm.engine.training.trainer_config import load_config

ROOT = Path(__file__).resolve().parents[2] / "cookbooks"
COOKBOOKS = {
    "math": "math",
    "countdown": "countdown",
    "frozenlake": "frozenlake",
    "finqa": "finqa",
    "solver_judge": "solver-judge",
    "terminal": "terminal",
    "deepcoder": "deepcoder",
    "geo3k": "geo3k",
}


@pytest.mark.parametrize("directory", sorted(COOKBOOKS))
@pytest.mark.parametrize("backend", ["tinker_local", "tinker_remote", "verl"])
def test_config_files_load(directory, backend):
    name = COOKBOOKS[directory]
    cookbook = load_cookbook(name)
    base = {**cookbook.train_defaults, "cookbook": name}
    config = load_config(ROOT / directory / "configs" / f"{backend}.yaml", base=base)
    assert config.backend.name == ("verl" if backend == "verl" else "tinker")
    if backend != "verl":
        options = parse_config(config.backend.options)
        assert options.service == backend.removeprefix("tinker_") and options.model
    assert (ROOT / directory / "README.md").is_file()
    assert msgspec.to_builtins(config)["train_split"] == "train"
