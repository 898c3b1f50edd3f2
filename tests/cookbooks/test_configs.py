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


def test_the_real_model_cpu_preset_loads_with_its_documented_values() -> None:
    # cookbooks/math/configs/smollm2_cpu.yaml, documented in cookbooks/math/README.md.
    cookbook = load_cookbook("math")
    base = {**cookbook.train_defaults, "cookbook": "math"}
    config = load_config(ROOT / "math" / "configs" / "smollm2_cpu.yaml", base=base)
    options = parse_config(config.backend.options)
    assert options.service == "local" and options.model.endswith(".gguf")
    assert options.lora.rank == 16 and options.micro_batch_tokens == 256 and options.gradient_checkpointing
    assert options.learning_rate == 1e-3
    assert options.sampler_max_batch == 16 < config.rollout.concurrency
    assert config.rollout.deadline_s == 300 and config.val_tasks == 10 and config.val_split == "test"
    # A key given replaces its default whole: sampling keeps the policy's temperature.
    assert config.rollout.sampling.temperature == 1.0 and config.rollout.sampling.max_tokens == 128
    assert config.rollout.val_sampling is not None and config.rollout.val_sampling.temperature == 0.0
    # The answer format is part of the reward (measured: without it the box is dropped).
    assert config.cookbook_options == {"format_coef": 1.0}
    assert cookbook.with_options(config.cookbook_options).evaluator.format_coef == 1.0  # type: ignore[attr-defined]
    readme = (ROOT / "math" / "README.md").read_text()
    assert "configs/smollm2_cpu.yaml" in readme and "`cookbook_options.format_coef` | 1.0" in readme
