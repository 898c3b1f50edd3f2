"""Validation: refusals name each option the service cannot honour; config errors name the dotted
``backend.options`` key; the API key comes from FIREWORKS_API_KEY only. No network."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from fireworks_helpers import MODEL

from rllm.algos.config import AlgorithmConfig
from rllm.backends.fireworks import FireworksBackend, parse_config
from rllm.engine.backend import Backend
from rllm.engine.plugins import backend_class
from rllm.engine.training.launch import build_trainer
from rllm.engine.training.trainer_config import ConfigError


def test_registered_as_an_entry_point_implementing_the_protocol() -> None:
    assert backend_class("fireworks") is FireworksBackend
    assert isinstance(FireworksBackend({"model": MODEL}), Backend)


@pytest.mark.parametrize(
    ("algo", "option"),
    [
        (AlgorithmConfig(kl_coef=0.1), "kl_coef"),
        (AlgorithmConfig(entropy_coef=0.01), "entropy_coef"),
        (AlgorithmConfig(tis="token"), "tis"),
        (AlgorithmConfig(max_mismatch=0.05), "max_mismatch"),
    ],
)
def test_refuses_what_the_service_cannot_honour(algo: AlgorithmConfig, option: str) -> None:
    with pytest.raises(ValueError, match=f"`{option}`"):
        FireworksBackend({"model": MODEL}).validate(algo)


def test_names_every_refused_option_at_once() -> None:
    algo = AlgorithmConfig(kl_coef=0.1, entropy_coef=0.01, tis="sequence")
    with pytest.raises(ValueError) as err:
        FireworksBackend({"model": MODEL}).validate(algo)
    assert all(f"`{name}`" in str(err.value) for name in ("kl_coef", "entropy_coef", "tis"))


@pytest.mark.parametrize("loss", ["ppo_clip", "dual_clip", "gspo", "cispo"])
def test_the_trust_region_correction_is_the_services_own_convention(loss: str) -> None:
    """tis = trust_region takes the ratio against the sampler's logprobs: what this service does."""
    FireworksBackend({"model": MODEL}).validate(AlgorithmConfig(loss=loss, tis="trust_region"))


@pytest.mark.parametrize("loss", ["ppo_clip", "dual_clip", "gspo", "cispo", "importance_sampling"])
@pytest.mark.parametrize(
    "aggregation",
    ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"],
)
def test_every_loss_and_aggregation_is_honoured(loss: str, aggregation: str) -> None:
    """Every loss runs as rllm.algos' own loss (forward_backward_custom), so none is refused."""
    FireworksBackend({"model": MODEL}).validate(AlgorithmConfig(loss=loss, aggregation=aggregation))


@pytest.mark.parametrize(
    ("options", "key"),
    [
        ({}, "backend.options.model"),
        ({"model": MODEL, "lora_rank": -1}, "backend.options.lora_rank"),
        ({"model": MODEL, "lora_rank": "eight"}, "backend.options.lora_rank"),
        ({"model": MODEL, "training_shape": "ts-qwen3"}, "backend.options.training_shape"),
        ({"model": MODEL, "deployment_id": "Bad_Id"}, "backend.options.deployment_id"),
        ({"model": MODEL, "hot_load_timeout_s": 0}, "backend.options.hot_load_timeout_s"),
        ({"model": MODEL, "region": 3}, "backend.options.region"),
        ({"model": MODEL, "base_url": "api.fireworks.ai"}, "backend.options.base_url"),
        ({"model": MODEL, "acount": "typo"}, "backend.options.acount"),
        ({"model": MODEL, "api_key": "fw-secret"}, "backend.options.api_key"),
    ],
)
def test_config_errors_name_the_dotted_key(options: dict, key: str) -> None:
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        parse_config(options)


def test_config_round_trips_through_builtins() -> None:
    config = parse_config({"model": MODEL, "deployment_id": "my-run", "region": "US_VIRGINIA_1"})
    assert parse_config(msgspec.to_builtins(config)) == config
    assert config.resolved_inference_url() == "https://api.fireworks.ai/inference/v1"


async def test_start_needs_the_api_key_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FIREWORKS_API_KEY", raising=False)
    backend = FireworksBackend({"model": MODEL})
    with pytest.raises(ValueError, match="FIREWORKS_API_KEY"):
        await backend.start()
    with pytest.raises(RuntimeError, match="not started"):
        backend.inference_urls()


def test_the_trainer_refuses_before_anything_starts(tmp_path: Path) -> None:
    """A run config with a refused option fails at build time, naming it: nothing is provisioned."""
    with pytest.raises(ConfigError, match="`kl_coef`"):
        build_trainer(
            "say",
            backend="fireworks",
            out_dir=str(tmp_path),
            overrides=[f"backend.options.model={MODEL}", "algorithm.kl_coef=0.05", "progress=false"],
        )
