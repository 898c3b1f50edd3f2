"""backend.options: mapping to verl's config, and errors that name the dotted key (no Ray, no verl).

Runs in every environment: parsing and checking never import verl, so a bad option is refused
before Ray or verl would start.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rllm.algos import AlgorithmConfig
from rllm.backends.verl.backend import VerlBackend
from rllm.backends.verl.config import parse_config
from rllm.engine.plugins import backend_class
from rllm.types import ConfigError

pytestmark = pytest.mark.verl


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"rollout": {"engine": "trtllm"}}, "backend.options.rollout.engine: Invalid enum value 'trtllm'"),
        (
            {"rollout": {"gpu_memory_utilization": 1.5}},
            "backend.options.rollout.gpu_memory_utilization: must be in (0, 1]",
        ),
        ({"cluster": {"gpus": 8}}, "backend.options.cluster.gpus: unknown key"),
        ({"micro_batch_size_per_gpu": "four"}, "backend.options.micro_batch_size_per_gpu: Expected `int`"),
        ({"micro_batch_size_per_gpu": 0}, "backend.options.micro_batch_size_per_gpu: must be >= 1"),
        (
            {"cluster": {"gpus_per_node": 4}, "rollout": {"tensor_model_parallel_size": 3}},
            "backend.options.rollout.tensor_model_parallel_size: must be >= 1 and divide the 4 GPUs",
        ),
        (
            {"cluster": {"gpus_per_node": 8}, "fsdp": {"ulysses_sequence_parallel_size": 3}},
            "backend.options.fsdp.ulysses_sequence_parallel_size",
        ),
        ({"cluster": {"gpus_per_node": 8}, "fsdp": {"fsdp_size": 3}}, "backend.options.fsdp.fsdp_size"),
        (
            {
                "strategy": "megatron",
                "cluster": {"gpus_per_node": 4},
                "megatron": {"tensor_model_parallel_size": 8},
            },
            "backend.options.megatron: tensor x pipeline x context parallel sizes (8) must divide the 4 GPUs",
        ),
        ({"cluster": {"device": "cpu", "nnodes": 2}}, "backend.options.cluster.device"),
        ({"optim": {"lr": -1.0}}, "backend.options.optim.lr: must be a finite number > 0"),
        ({"lora": {"rank": -8}}, "backend.options.lora.rank: must be >= 0"),
        ({"learning_rate": 0.0}, "backend.options.learning_rate: must be a finite number > 0"),
        ({"bogus": 1}, "backend.options.bogus: unknown key"),
        ({"pack_tokens": 512}, "backend.options.pack_tokens: verl packs by itself"),
        ({"strategy": "deepspeed"}, "backend.options.strategy: Invalid enum value 'deepspeed'"),
        ({"rollout": {"engine": "external"}}, "backend.options.rollout.server_urls: engine 'external' needs"),
        (
            {"rollout": {"engine": "external", "server_urls": ["127.0.0.1:8000"]}},
            "backend.options.rollout.server_urls[0]: must be an http(s) base URL ending in /v1",
        ),
        (
            {"rollout": {"server_urls": ["http://h:8000/v1"]}},
            "backend.options.rollout.server_urls: only for engine 'external', not 'vllm'",
        ),
        (
            {"rollout": {"weights_dir": "/w"}},
            "backend.options.rollout.weights_dir: only for engine 'external'",
        ),
    ],
)
def test_bad_options_are_refused_naming_the_dotted_key(options: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(options)
    assert message in str(info.value)


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"micro_batch_size_per_gpu": 0, "rollout": {"max_model_len": 0}})
    assert "micro_batch_size_per_gpu" in str(info.value) and "rollout.max_model_len" in str(info.value)


def test_multi_node_options_parse() -> None:
    config = parse_config(
        {
            "model": "/models/qwen",
            "cluster": {"nnodes": 2, "gpus_per_node": 8, "ray_address": "10.0.0.1:6379"},
            "rollout": {"engine": "sglang", "tensor_model_parallel_size": 4, "gpu_memory_utilization": 0.6},
            "fsdp": {"param_offload": True, "ulysses_sequence_parallel_size": 2},
            "lora": {"rank": 32, "target_modules": ["q_proj", "v_proj"]},
        }
    )
    assert config.world_size == 16 and config.rollout.engine == "sglang" and config.lora.rank == 32


def test_the_entry_point_is_the_backend_and_validation_precedes_ray() -> None:
    assert backend_class("verl") is VerlBackend
    backend = VerlBackend({"model": "/models/x"}, micro_batch_size_per_gpu=2)
    assert backend.config.micro_batch_size_per_gpu == 2 and backend.served_model_name() == "/models/x"
    backend.validate(AlgorithmConfig(loss="gspo", tis="token", kl_coef=0.1))
    with pytest.raises(ValueError, match=r"backend\.options\.model"):
        VerlBackend({}).validate(AlgorithmConfig())
    with pytest.raises(ValueError, match="unknown value 'ppo2' for `loss`"):
        backend.validate(AlgorithmConfig(loss="ppo2"))
    # train_step records the trainer's logprobs, so the mismatch limit is honoured (test_verl_mismatch.py).
    backend.validate(AlgorithmConfig(max_mismatch=0.05))


@pytest.mark.parametrize("loss", ["topk_forward_kl", "topk_reverse_kl"])
def test_the_topk_distillation_losses_are_refused_by_name(loss: str) -> None:
    """verl's actor computes the sampled tokens' logprobs only (no top-k of the teacher's): `rllm
    distill` with distill.loss=topk stops before anything starts (distill.loss=sampled runs)."""
    with pytest.raises(ValueError, match=f"`loss` = '{loss}'.*distill.loss=sampled"):
        VerlBackend({"model": "/models/x"}).validate(AlgorithmConfig(loss=loss))


def test_the_cpu_needs_an_external_rollout() -> None:
    with pytest.raises(ValueError, match=r"backend\.options\.cluster\.device: 'cpu' needs rollout\.engine"):
        VerlBackend({"model": "/m", "cluster": {"device": "cpu"}}).validate(AlgorithmConfig())
    external = {"engine": "external", "server_urls": ["http://127.0.0.1:8000/v1", "https://h/x/v1/"]}
    backend = VerlBackend({"model": "/m", "cluster": {"device": "cpu"}, "rollout": external})
    backend.validate(AlgorithmConfig())
    assert backend.config.rollout.server_urls == external["server_urls"]


def test_without_a_sampler_only_supervised_training_is_accepted() -> None:
    """rollout.engine = 'none' (`rllm sft`, on the CPU too): RL losses and KL are refused before
    Ray starts, naming the key to change."""
    from rllm.engine.data.sft import SFT_ALGORITHM

    backend = VerlBackend({"model": "/m", "cluster": {"device": "cpu"}, "rollout": {"engine": "none"}})
    backend.validate(SFT_ALGORITHM)
    for algo in (AlgorithmConfig(loss="ppo_clip"), AlgorithmConfig(loss="cross_entropy", kl_coef=0.1)):
        with pytest.raises(
            ConfigError, match=r"backend\.options\.rollout\.engine = 'none' starts no sampler"
        ) as err:
            backend.validate(algo)
        assert err.value.key == "backend.options.rollout.engine"
    # A sampler-less run has no servers to name.
    with pytest.raises(ConfigError, match="only for engine 'external'"):
        VerlBackend({"model": "/m", "rollout": {"engine": "none", "server_urls": ["http://h/v1"]}})


def test_rllm_train_without_a_sampler_is_refused_before_anything_starts(tmp_path: Path) -> None:
    pytest.importorskip("rllm_cookbook_say", reason="the say cookbook is not installed in this environment")
    from rllm.engine.training.launch import build_trainer

    options = ["backend.options.cluster.device=cpu", "backend.options.rollout.engine=none"]
    with pytest.raises(ConfigError, match=r"loss 'ppo_clip': backend\.options\.rollout\.engine = 'none'"):
        build_trainer("say", backend="verl", out_dir=str(tmp_path / "run"), overrides=options)
    assert not (tmp_path / "run").exists()  # refused before the tiny model or the run folder


def test_rllm_train_with_a_bad_option_fails_before_anything_starts(tmp_path: Path) -> None:
    pytest.importorskip("rllm_cookbook_say", reason="the say cookbook is not installed in this environment")
    from rllm.engine.training.launch import build_trainer

    with pytest.raises(ConfigError, match=r"backend\.options\.rollout\.gpu_memory_utilization"):
        build_trainer(
            "say",
            backend="verl",
            out_dir=str(tmp_path),
            overrides=["backend.options.rollout.gpu_memory_utilization=2.0"],
        )
