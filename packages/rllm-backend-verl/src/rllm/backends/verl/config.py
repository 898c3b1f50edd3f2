"""VerlBackendConfig: the typed ``backend.options`` of the verl backend, checked before Ray starts.

Every error names the dotted key under ``backend.options`` that is wrong, so a config file or a
``backend.options.x.y=...`` override can be fixed without reading a Ray traceback.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, Literal

import msgspec

from rllm.algos.optim import AdamWSettings
from rllm.types.config_file import parse_options
from rllm.types.errors import ConfigError

PREFIX = "backend.options"
NO_ROLLOUT = "none"  # rollout.engine: the trainer's workers only, no sampler (supervised training)


class ClusterOptions(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Where the workers run. ``ray_address`` "" starts a Ray instance inside this process
    (single node); "auto" joins the cluster this node belongs to (``ray start`` ran here);
    "HOST:6379" or "ray://HOST:10001" joins a remote head."""

    nnodes: int = 1
    gpus_per_node: int = 1
    ray_address: str = ""
    device: Literal["cuda", "cpu"] = "cuda"


class FSDPOptions(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    fsdp_size: int = -1  # -1: shard over every GPU; otherwise HSDP groups of this size
    ulysses_sequence_parallel_size: int = 1
    param_offload: bool = False
    optimizer_offload: bool = False
    model_dtype: Literal["fp32", "bf16"] = "fp32"  # master weights
    mixed_precision: Literal["bf16", "fp16", "fp32"] = "bf16"  # compute dtype


class MegatronOptions(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Passed to verl's Megatron engine (strategy = "megatron", needs megatron-core)."""

    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    context_parallel_size: int = 1
    expert_model_parallel_size: int = 1
    sequence_parallel: bool = True
    param_offload: bool = False
    optimizer_offload: bool = False


class LoraOptions(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    rank: int = 0  # 0: full fine-tuning
    alpha: int = 16
    target_modules: list[str] | Literal["all-linear"] = "all-linear"


class OptimOptions(AdamWSettings, kw_only=True, forbid_unknown_fields=True, rename={"learning_rate": "lr"}):
    """rllm.algos' AdamWSettings under verl's spelling and defaults: the learning rate is
    ``optim.lr`` (``optim.learning_rate`` in Python), 1e-6, and the weight decay verl's 0.01;
    plus verl's linear warmup. ``grad_clip <= 0`` disables clipping, as on every backend."""

    # Redeclared for their verl defaults (and learning_rate for the rename, which msgspec applies
    # only to the fields a class declares).
    learning_rate: float = 1e-6
    weight_decay: float = 0.01
    warmup_steps: int = 0

    def verl_kwargs(self, strategy: str) -> dict[str, Any]:
        """The AdamW settings as keywords of verl's optimizer config (FSDP or Megatron) besides
        ``lr``. verl clips at whatever ``clip_grad`` says (0 would zero every update), so "no
        clipping" goes to it as infinity; eps reaches the optimizer through its override table
        (torch's AdamW for FSDP; Megatron reads betas and eps only from there)."""
        extra: dict[str, float]
        if strategy == "megatron":
            extra = {"adam_beta1": self.betas[0], "adam_beta2": self.betas[1], "adam_eps": self.eps}
        else:
            extra = {"eps": self.eps}
        return {
            "weight_decay": self.weight_decay,
            "betas": self.betas,
            "clip_grad": self.grad_clip if self.grad_clip > 0 else math.inf,
            "lr_warmup_steps": self.warmup_steps,
            "override_optimizer_config": extra,
        }


class RolloutOptions(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """verl's async rollout servers; each replica is one OpenAI-compatible gateway upstream.

    ``engine = "external"``: servers that are already running (``server_urls``, vLLM in dev mode)
    instead of ones verl starts; after every optimizer step the trainer writes the weights into
    ``weights_dir`` and each server reloads them (external_rollout.py). The GPU settings below
    then do not apply: the servers were started with their own.

    ``engine = "none"``: no sampler at all, only the trainer's workers (``rllm sft``, which samples
    nothing; on the CPU too). RL needs a sampler, so ``validate`` refuses RL losses with it.
    """

    engine: Literal["vllm", "sglang", "external", "none"] = "vllm"
    server_urls: list[str] = msgspec.field(default_factory=list)  # engine "external": base URLs ending in /v1
    weights_dir: str = ""  # engine "external": "" = a fresh temporary directory on this machine
    tensor_model_parallel_size: int = 1
    gpu_memory_utilization: float = 0.5
    max_model_len: int = 4096
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    enforce_eager: bool = False
    free_cache_engine: bool = True  # release the KV cache while the trainer runs (hybrid engine)


class VerlBackendConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    model: str = ""  # local path or hub name of the policy
    served_model_name: str = (
        ""  # the model name agents send; default: ``model`` (what verl's servers answer to)
    )
    seed: int = 0
    strategy: Literal["fsdp", "fsdp2", "megatron"] = "fsdp2"
    attn_implementation: str = ""  # "" = flash_attention_2 on GPUs, sdpa on the CPU
    gradient_checkpointing: bool = True
    cluster: ClusterOptions = msgspec.field(default_factory=ClusterOptions)
    fsdp: FSDPOptions = msgspec.field(default_factory=FSDPOptions)
    megatron: MegatronOptions = msgspec.field(default_factory=MegatronOptions)
    lora: LoraOptions = msgspec.field(default_factory=LoraOptions)
    optim: OptimOptions = msgspec.field(default_factory=OptimOptions)
    # The backend-neutral name cookbooks' train_defaults use (as on the tinker backend); when
    # set it is the learning rate, and optim.lr is ignored.
    learning_rate: float | None = None
    rollout: RolloutOptions = msgspec.field(default_factory=RolloutOptions)
    # How one train_step is cut: ``mini_batches`` optimizer steps per epoch, ``ppo_epochs`` epochs,
    # each mini-batch in micro-batches of ``micro_batch_size_per_gpu`` sequences (or, with
    # ``use_dynamic_bsz``, of at most ``max_token_len_per_gpu`` tokens).
    mini_batches: int = 1
    ppo_epochs: int = 1
    shuffle: bool = False
    micro_batch_size_per_gpu: int = 4
    log_prob_micro_batch_size_per_gpu: int = 8
    use_dynamic_bsz: bool = False
    max_token_len_per_gpu: int = 16384

    @property
    def world_size(self) -> int:
        return self.cluster.nnodes * self.cluster.gpus_per_node

    @property
    def data_parallel_size(self) -> int:
        """Ranks that each take their own share of a batch (the rest shard the model or sequence)."""
        if self.strategy == "megatron":
            m = self.megatron
            model_parallel = (
                m.tensor_model_parallel_size * m.pipeline_model_parallel_size * m.context_parallel_size
            )
            return max(self.world_size // model_parallel, 1)
        return max(self.world_size // self.fsdp.ulysses_sequence_parallel_size, 1)

    @property
    def lr(self) -> float:
        return self.optim.learning_rate if self.learning_rate is None else self.learning_rate

    def resolved_served_model_name(self) -> str:
        # verl starts vLLM/SGLang without --served-model-name, so they answer to the model path.
        return self.served_model_name or self.model

    def resolved_attn_implementation(self) -> str:
        if self.attn_implementation:
            return self.attn_implementation
        return "sdpa" if self.cluster.device == "cpu" else "flash_attention_2"


# The local backend's ``pack_tokens`` has no verl counterpart to set: verl decides by itself.
PACKING = (
    "verl packs by itself where it can: on GPUs its remove-padding path lays each micro-batch's "
    "sequences end to end in one row (flash-attn's varlen kernels keep attention inside each "
    "sequence; positions restart per sequence); `use_dynamic_bsz` with `max_token_len_per_gpu` "
    "sets a row's token budget. On the CPU (no flash-attn) each sequence is its own padded row. "
    "Remove pack_tokens"
)


def parse_config(
    options: VerlBackendConfig | Mapping[str, Any] | None, **overrides: Any
) -> VerlBackendConfig:
    """A checked config from a mapping (TOML/YAML/CLI overrides); errors read
    ``backend.options.KEY: MESSAGE`` (rllm.types.config_file.parse_options), the cross-field
    checks all at once."""
    if "pack_tokens" in overrides or (isinstance(options, Mapping) and "pack_tokens" in options):
        raise ConfigError(f"{PREFIX}.pack_tokens: {PACKING}", f"{PREFIX}.pack_tokens")
    config = parse_options(options, VerlBackendConfig, prefix=PREFIX, overrides=overrides)
    check(config)
    return config


def check(config: VerlBackendConfig) -> None:
    """Cross-field checks msgspec's types cannot express."""
    errors: list[str] = []
    keys: list[str] = []

    def need(ok: bool, key: str, message: str) -> None:
        if not ok:
            keys.append(f"{PREFIX}.{key}")
            errors.append(f"{PREFIX}.{key}: {message}")

    c, r = config.cluster, config.rollout
    need(c.nnodes >= 1, "cluster.nnodes", f"must be >= 1, got {c.nnodes}")
    need(c.gpus_per_node >= 1, "cluster.gpus_per_node", f"must be >= 1, got {c.gpus_per_node}")
    need(
        c.device == "cuda" or c.nnodes == 1,
        "cluster.device",
        "device 'cpu' (verl's engine on the CPU) runs on one node only",
    )
    world = max(config.world_size, 1)
    need(
        r.tensor_model_parallel_size >= 1 and world % r.tensor_model_parallel_size == 0,
        "rollout.tensor_model_parallel_size",
        f"must be >= 1 and divide the {world} GPUs (nnodes x gpus_per_node), got {r.tensor_model_parallel_size}",
    )
    need(
        0.0 < r.gpu_memory_utilization <= 1.0,
        "rollout.gpu_memory_utilization",
        f"must be in (0, 1], got {r.gpu_memory_utilization}",
    )
    for key in ("max_model_len", "max_num_seqs", "max_num_batched_tokens"):
        need(getattr(r, key) >= 1, f"rollout.{key}", f"must be >= 1, got {getattr(r, key)}")
    if r.engine == "external":
        need(bool(r.server_urls), "rollout.server_urls", "engine 'external' needs the servers' base URLs")
        for index, url in enumerate(r.server_urls):
            need(
                re.fullmatch(r"https?://[^/\s]+(/\S*)?/v1/?", url) is not None,
                f"rollout.server_urls[{index}]",
                f"must be an http(s) base URL ending in /v1, got {url!r}",
            )
    else:
        need(not r.server_urls, "rollout.server_urls", f"only for engine 'external', not {r.engine!r}")
        need(not r.weights_dir, "rollout.weights_dir", f"only for engine 'external', not {r.engine!r}")
    sp = config.fsdp.ulysses_sequence_parallel_size
    need(
        sp >= 1 and world % sp == 0,
        "fsdp.ulysses_sequence_parallel_size",
        f"must be >= 1 and divide the {world} GPUs, got {sp}",
    )
    fsdp_size = config.fsdp.fsdp_size
    need(
        fsdp_size == -1 or (fsdp_size >= 1 and world % fsdp_size == 0),
        "fsdp.fsdp_size",
        f"must be -1 or divide the {world} GPUs, got {fsdp_size}",
    )
    m = config.megatron
    model_parallel = m.tensor_model_parallel_size * m.pipeline_model_parallel_size * m.context_parallel_size
    need(
        config.strategy != "megatron" or (model_parallel >= 1 and world % model_parallel == 0),
        "megatron",
        f"tensor x pipeline x context parallel sizes ({model_parallel}) must divide the {world} GPUs",
    )
    need(config.lora.rank >= 0, "lora.rank", f"must be >= 0, got {config.lora.rank}")
    # The settings the optimizer gets: a top-level learning_rate replaces optim.lr (not checked then).
    effective = msgspec.structs.replace(config.optim, learning_rate=config.lr)
    for key, message in effective.adamw_problems():
        top_level = key == "lr" and config.learning_rate is not None
        need(False, "learning_rate" if top_level else f"optim.{key}", message)
    for key in (
        "mini_batches",
        "ppo_epochs",
        "micro_batch_size_per_gpu",
        "log_prob_micro_batch_size_per_gpu",
    ):
        need(getattr(config, key) >= 1, key, f"must be >= 1, got {getattr(config, key)}")
    need(
        config.max_token_len_per_gpu >= 1,
        "max_token_len_per_gpu",
        f"must be >= 1, got {config.max_token_len_per_gpu}",
    )
    if errors:
        raise ConfigError("; ".join(errors), keys[0])
