"""VerlBackendConfig → verl's own trainer config (its Hydra ``ppo_trainer`` schema).

The overrides are composed against verl's shipped config, so a key verl does not have fails at
composition with Hydra's message; our own checks (config.py) already named the dotted
``backend.options`` key for every value.
"""

from __future__ import annotations

from typing import Any

from rllm.algos.config import AlgorithmConfig
from rllm.backends.verl.config import VerlBackendConfig


def verl_overrides(config: VerlBackendConfig, algo: AlgorithmConfig | None = None) -> list[str]:
    """Hydra overrides of verl's trainer config that express ``config`` (and the KL switch of ``algo``)."""
    kl = algo is not None and algo.kl_coef > 0
    cpu = config.cluster.device == "cpu"
    actor, rollout, model = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.model"
    r, o = config.rollout, config.optim
    targets = config.lora.target_modules
    out = [
        f"{model}.path={config.model}",
        f"{model}.lora_rank={config.lora.rank}",
        f"{model}.lora_alpha={config.lora.alpha}",
        f"{model}.target_modules={targets if isinstance(targets, str) else '[' + ','.join(targets) + ']'}",
        f"{model}.enable_gradient_checkpointing={config.gradient_checkpointing}",
        f"{model}.use_remove_padding={not cpu}",
        f"+{model}.override_config.attn_implementation={config.resolved_attn_implementation()}",
        f"{actor}.strategy={config.strategy}",
        # rLLM sizes each mini-batch per train_step (update_policy); this is verl's required default.
        f"{actor}.ppo_mini_batch_size=1",
        f"{actor}.ppo_micro_batch_size_per_gpu={config.micro_batch_size_per_gpu}",
        f"{actor}.use_dynamic_bsz={config.use_dynamic_bsz}",
        f"{actor}.ppo_max_token_len_per_gpu={config.max_token_len_per_gpu}",
        f"{actor}.ppo_epochs={config.ppo_epochs}",
        f"{actor}.shuffle={config.shuffle}",
        f"{actor}.optim.lr={config.lr}",
        *_optim_overrides(f"{actor}.optim", o.verl_kwargs(config.strategy)),
        # KL and entropy are terms of rLLM's loss (RllmPolicyLoss); verl's own must stay off.
        f"{actor}.use_kl_loss={kl}",
        f"{actor}.kl_loss_coef=0.0",
        f"{actor}.entropy_coeff=0",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={config.log_prob_micro_batch_size_per_gpu}",
        f"{rollout}.name={r.engine}",
        f"{rollout}.mode=async",
        f"{rollout}.tensor_model_parallel_size={r.tensor_model_parallel_size}",
        f"{rollout}.gpu_memory_utilization={r.gpu_memory_utilization}",
        f"{rollout}.max_model_len={r.max_model_len}",
        f"{rollout}.max_num_seqs={r.max_num_seqs}",
        f"{rollout}.max_num_batched_tokens={r.max_num_batched_tokens}",
        f"{rollout}.enforce_eager={r.enforce_eager}",
        f"{rollout}.free_cache_engine={r.free_cache_engine}",
        f"{rollout}.log_prob_micro_batch_size_per_gpu={config.log_prob_micro_batch_size_per_gpu}",
        f"trainer.n_gpus_per_node={config.cluster.gpus_per_node}",
        f"trainer.nnodes={config.cluster.nnodes}",
        f"trainer.device={config.cluster.device}",
    ]
    if r.engine == "external":
        # External servers reload full weights from disk; LoRA reaches them merged into the base.
        out.append(f"{model}.lora.merge=True")
    if config.strategy == "megatron":
        m = config.megatron
        for role in ("actor", "ref"):
            base = f"actor_rollout_ref.{role}.megatron"
            out += [
                f"{base}.tensor_model_parallel_size={m.tensor_model_parallel_size}",
                f"{base}.pipeline_model_parallel_size={m.pipeline_model_parallel_size}",
                f"{base}.context_parallel_size={m.context_parallel_size}",
                f"{base}.expert_model_parallel_size={m.expert_model_parallel_size}",
                f"{base}.sequence_parallel={m.sequence_parallel}",
                f"{base}.param_offload={m.param_offload}",
            ]
        out.append(f"{actor}.megatron.optimizer_offload={m.optimizer_offload}")
    else:
        f = config.fsdp
        out += [
            f"{actor}.fsdp_config.strategy={config.strategy}",
            f"{actor}.fsdp_config.param_offload={f.param_offload}",
            f"{actor}.fsdp_config.optimizer_offload={f.optimizer_offload}",
            f"{actor}.fsdp_config.fsdp_size={f.fsdp_size}",
            f"{actor}.fsdp_config.model_dtype={f.model_dtype}",
            f"{actor}.ulysses_sequence_parallel_size={f.ulysses_sequence_parallel_size}",
            f"actor_rollout_ref.ref.fsdp_config.param_offload={f.param_offload}",
        ]
        # The CPU computes in fp32: bf16 matmuls there are slow and round the log-probs.
        compute = "fp32" if cpu else f.mixed_precision
        for role in ("actor", "ref"):
            base = f"+actor_rollout_ref.{role}.fsdp_config.mixed_precision"
            out += [f"{base}.param_dtype={compute}", f"{base}.reduce_dtype=fp32", f"{base}.buffer_dtype=fp32"]
        if cpu:
            out += [
                f"{actor}.fsdp_config.use_torch_compile=False",
                "actor_rollout_ref.ref.fsdp_config.use_torch_compile=False",
                # verl's forward-only FSDP2 build pins its CPU offload memory, which needs CUDA;
                # built for training instead (with the actor's optimizer settings, which a
                # training build needs), the reference engine is simply never stepped.
                "actor_rollout_ref.ref.fsdp_config.forward_only=False",
                "+actor_rollout_ref.ref.optim=${actor_rollout_ref.actor.optim}",
            ]
    return out


def _optim_overrides(base: str, kwargs: dict[str, Any]) -> list[str]:
    """verl's optimizer keywords as overrides: betas as a list, inf as ``inf``, and the override
    table key by key with ``+`` (Megatron's schema has it as an empty struct, which refuses
    assigning a whole table with new keys)."""
    out = []
    for key, value in kwargs.items():
        if isinstance(value, dict):
            out += [f"+{base}.{key}.{name}={item!r}" for name, item in value.items()]
        elif isinstance(value, tuple):
            out.append(f"{base}.{key}=[{','.join(repr(v) for v in value)}]")
        else:
            out.append(f"{base}.{key}={value!r}")
    return out


def compose_verl_config(config: VerlBackendConfig, algo: AlgorithmConfig | None = None) -> Any:
    """verl's full trainer DictConfig with our overrides applied (no Ray, no GPU needed)."""
    from hydra import compose, initialize_config_module

    name = "ppo_megatron_trainer" if config.strategy == "megatron" else "ppo_trainer"
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return compose(config_name=name, overrides=verl_overrides(config, algo))
