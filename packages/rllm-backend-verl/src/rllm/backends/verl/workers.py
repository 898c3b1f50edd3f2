"""verl worker configs from VerlBackendConfig, and an in-process training worker (one rank).

The same ``TrainingWorkerConfig`` feeds ``TrainingWorker`` whether Ray places it on GPUs or the
tests build it here on the CPU.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from rllm.backends.verl.config import VerlBackendConfig
from rllm.types.errors import InputError


def training_worker_config(config: VerlBackendConfig, *, forward_only: bool = False) -> Any:
    """verl's TrainingWorkerConfig for the policy (or, ``forward_only``, the frozen reference)."""
    from verl.trainer.config import CheckpointConfig
    from verl.workers.config import (
        FSDPEngineConfig,
        FSDPOptimizerConfig,
        HFModelConfig,
        McoreEngineConfig,
        McoreOptimizerConfig,
        TrainingWorkerConfig,
    )

    cpu = config.cluster.device == "cpu"
    model = HFModelConfig(
        path=config.model,
        # verl's padding-free path needs flash-attn's varlen kernels; the CPU runs padded batches.
        use_remove_padding=not cpu,
        enable_gradient_checkpointing=config.gradient_checkpointing,
        override_config={"attn_implementation": config.resolved_attn_implementation()},
        lora_rank=config.lora.rank,
        lora_alpha=config.lora.alpha,
        target_modules=config.lora.target_modules,
    )
    batching = {
        "use_dynamic_bsz": config.use_dynamic_bsz,
        "max_token_len_per_gpu": config.max_token_len_per_gpu,
        "micro_batch_size_per_gpu": config.micro_batch_size_per_gpu,
        "infer_max_token_len_per_gpu": config.max_token_len_per_gpu,
        "infer_micro_batch_size_per_gpu": config.log_prob_micro_batch_size_per_gpu,
        "seed": config.seed,
        "forward_only": forward_only,
    }
    optim = config.optim
    if config.strategy == "megatron":
        m = config.megatron
        engine: Any = McoreEngineConfig(
            tensor_model_parallel_size=m.tensor_model_parallel_size,
            pipeline_model_parallel_size=m.pipeline_model_parallel_size,
            context_parallel_size=m.context_parallel_size,
            expert_model_parallel_size=m.expert_model_parallel_size,
            sequence_parallel=m.sequence_parallel,
            param_offload=m.param_offload,
            optimizer_offload=m.optimizer_offload,
            **batching,
        )
        optimizer: Any = McoreOptimizerConfig(lr=config.lr, **optim.verl_kwargs(config.strategy))
    else:
        f = config.fsdp
        engine = FSDPEngineConfig(
            strategy=config.strategy,
            fsdp_size=f.fsdp_size,
            ulysses_sequence_parallel_size=f.ulysses_sequence_parallel_size,
            param_offload=f.param_offload,
            optimizer_offload=f.optimizer_offload,
            model_dtype=f.model_dtype,
            dtype="float32"
            if cpu
            else {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[f.mixed_precision],
            # The CPU computes in fp32: bf16 matmuls there are slow and round the log-probs.
            mixed_precision={
                "param_dtype": "fp32" if cpu else f.mixed_precision,
                "reduce_dtype": "fp32",
                "buffer_dtype": "fp32",
            },
            use_torch_compile=False,
            **batching,
        )
        optimizer = FSDPOptimizerConfig(lr=config.lr, **optim.verl_kwargs(config.strategy))
    return TrainingWorkerConfig(
        model_type="language_model",
        model_config=model,
        engine_config=engine,
        optimizer_config=None if forward_only else optimizer,
        checkpoint_config=CheckpointConfig(save_contents=["model", "optimizer", "extra"]),
    )


def local_training_worker(config: VerlBackendConfig, *, forward_only: bool = False) -> Any:
    """verl's TrainingWorker in this process as rank 0 of 1, on the CPU, initialised."""
    from rllm.backends.verl.cpu_platform import init_cpu_process_group, use_cpu_platform

    if config.cluster.device != "cpu" or config.world_size != 1:
        raise InputError(
            "a local training worker runs on the CPU as one rank (cluster.device = 'cpu', one GPU slot)"
        )
    use_cpu_platform()
    for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(key, value)
    # Always a fresh port: an inherited MASTER_PORT may be a parent process's live store (a test
    # run that trained in-process, then started `rllm sft` as a subprocess: EADDRINUSE).
    os.environ["MASTER_PORT"] = str(_free_port())
    init_cpu_process_group()
    from verl.workers.engine_workers import TrainingWorker

    worker = TrainingWorker(training_worker_config(config, forward_only=forward_only))
    worker.reset()
    return worker


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
