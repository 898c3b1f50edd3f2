"""Our options composed into verl's own trainer config (its shipped Hydra schema)."""

from __future__ import annotations

import pytest

# Named on its own in the workspace env (no verl there), the file skips; nox -s verl runs it.
pytest.importorskip("hydra")


from rllm.algos import AlgorithmConfig
from rllm.backends.verl.config import parse_config
from rllm.backends.verl.trainer_config import compose_verl_config

pytestmark = pytest.mark.verl


def test_options_land_where_verl_reads_them() -> None:
    config = parse_config(
        {
            "model": "/models/policy",
            "cluster": {"nnodes": 2, "gpus_per_node": 8},
            "rollout": {"engine": "sglang", "tensor_model_parallel_size": 2, "gpu_memory_utilization": 0.7},
            "fsdp": {"param_offload": True, "optimizer_offload": True, "ulysses_sequence_parallel_size": 2},
            "lora": {"rank": 16, "alpha": 32},
            "micro_batch_size_per_gpu": 3,
            "optim": {"lr": 2e-6},
        }
    )
    verl = compose_verl_config(config, AlgorithmConfig(kl_coef=0.05))
    arr = verl.actor_rollout_ref
    assert arr.model.path == "/models/policy" and arr.model.lora_rank == 16 and arr.model.lora_alpha == 32
    assert arr.model.override_config.attn_implementation == "flash_attention_2"
    assert arr.rollout.name == "sglang" and arr.rollout.mode == "async"
    assert arr.rollout.tensor_model_parallel_size == 2 and arr.rollout.gpu_memory_utilization == 0.7
    assert arr.actor.fsdp_config.param_offload and arr.actor.fsdp_config.optimizer_offload
    assert arr.actor.ulysses_sequence_parallel_size == 2
    assert arr.actor.ppo_micro_batch_size_per_gpu == 3 and arr.actor.optim.lr == 2e-6
    # KL is a term of rLLM's loss: verl's ref worker runs, verl's own KL term stays 0
    assert arr.actor.use_kl_loss and arr.actor.kl_loss_coef == 0.0 and arr.actor.entropy_coeff == 0
    assert verl.trainer.nnodes == 2 and verl.trainer.n_gpus_per_node == 8


def test_megatron_settings_pass_through() -> None:
    config = parse_config(
        {
            "model": "/m",
            "strategy": "megatron",
            "cluster": {"gpus_per_node": 8},
            "megatron": {"tensor_model_parallel_size": 4, "pipeline_model_parallel_size": 2},
        }
    )
    verl = compose_verl_config(config)
    assert verl.actor_rollout_ref.actor.megatron.tensor_model_parallel_size == 4
    assert verl.actor_rollout_ref.actor.megatron.pipeline_model_parallel_size == 2
    assert verl.actor_rollout_ref.ref.megatron.tensor_model_parallel_size == 4
    assert not verl.actor_rollout_ref.actor.use_kl_loss


def test_cpu_workers_compute_in_fp32_and_build_the_reference_for_the_cpu() -> None:
    external = {"engine": "external", "server_urls": ["http://127.0.0.1:8000/v1"]}
    config = parse_config(
        {"model": "/m", "cluster": {"device": "cpu"}, "rollout": external, "lora": {"rank": 8}}
    )
    arr = compose_verl_config(config, AlgorithmConfig(kl_coef=0.1)).actor_rollout_ref
    assert arr.rollout.name == "external" and arr.model.lora.merge  # servers reload merged weights
    for role in (arr.actor, arr.ref):
        assert (
            role.fsdp_config.mixed_precision.param_dtype == "fp32" and not role.fsdp_config.use_torch_compile
        )
    # verl's forward-only FSDP2 build pins memory (CUDA only): the CPU reference is a training build
    assert not arr.ref.fsdp_config.forward_only and arr.ref.optim.lr == arr.actor.optim.lr
    gpu = compose_verl_config(parse_config({"model": "/m"}), AlgorithmConfig()).actor_rollout_ref
    assert gpu.actor.fsdp_config.mixed_precision.param_dtype == "bf16" and gpu.ref.fsdp_config.forward_only


def test_the_adamw_settings_reach_verls_optimizer() -> None:
    """rllm.algos' AdamWSettings under `optim`: betas and clip_grad where verl reads them, eps in
    the optimizer's override table (torch AdamW's keyword on FSDP, Megatron's adam_* keys), and
    grad_clip <= 0 (no clipping, as on every backend) as an infinite clip_grad."""
    optim = {"lr": 3e-6, "weight_decay": 0.05, "betas": [0.8, 0.95], "eps": 1e-6, "grad_clip": 0.5}
    fsdp = compose_verl_config(parse_config({"model": "/m", "optim": optim})).actor_rollout_ref.actor.optim
    assert (fsdp.lr, fsdp.weight_decay, list(fsdp.betas), fsdp.clip_grad) == (3e-6, 0.05, [0.8, 0.95], 0.5)
    assert dict(fsdp.override_optimizer_config) == {"eps": 1e-6}

    megatron = parse_config({"model": "/m", "strategy": "megatron", "optim": {**optim, "grad_clip": 0.0}})
    mcore = compose_verl_config(megatron).actor_rollout_ref.actor.optim
    assert mcore.clip_grad == float("inf") and list(mcore.betas) == [0.8, 0.95]
    assert dict(mcore.override_optimizer_config) == {"adam_beta1": 0.8, "adam_beta2": 0.95, "adam_eps": 1e-6}
