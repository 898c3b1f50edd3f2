"""TinkerBackendConfig: the typed configuration of the Tinker backend (local and remote services)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any, Literal

import msgspec

from rllm.algos.adapters import LoraConfig
from rllm.algos.optim import AdamWSettings
from rllm.types.config_file import parse_options
from rllm.types.errors import ConfigError

OPTIONS = "backend.options"

__all__ = ["LoraConfig", "RemoteConfig", "TinkerBackendConfig", "parse_config"]


class RemoteConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Where the remote Tinker service lives. Empty strings fall back to the SDK's environment
    variables (``TINKER_BASE_URL``, ``TINKER_API_KEY``)."""

    base_url: str = ""
    api_key: str = ""
    # The Tinker OpenAI-compatible inference endpoint the gateway routes agents to (ends in /v1).
    inference_url: str = ""
    # Name of a sampler checkpoint path the OpenAI endpoint serves; set after each sync_weights.
    sampler_checkpoint_prefix: str = "rllm"
    request_timeout_s: float = 600.0

    def resolved_api_key(self) -> str:
        return self.api_key or os.environ.get("TINKER_API_KEY", "")

    def resolved_base_url(self) -> str | None:
        return self.base_url or os.environ.get("TINKER_BASE_URL") or None


class TinkerBackendConfig(AdamWSettings, kw_only=True, forbid_unknown_fields=True):
    """Everything the backend needs. One struct for both services; fields a service does not use
    are ignored by it (documented per field). The optimizer keys (``learning_rate``,
    ``weight_decay``, ``betas``, ``eps``, ``grad_clip``) are rllm.algos' AdamWSettings, with its
    defaults."""

    service: Literal["local", "remote"] = "local"
    model: str = ""  # local path or hub name (local: loaded with transformers; remote: base model name)
    lora: LoraConfig = msgspec.field(default_factory=LoraConfig)
    # How one train_step is cut: the batch is split into ``mini_batches`` optimizer steps, repeated
    # ``ppo_epochs`` times. Each mini-batch is further cut into micro-batches of at most
    # ``micro_batch_tokens`` padded tokens for gradient accumulation: "auto" (local service) picks
    # them from the step's memory estimate (local/memory.py; about 1024 on CPU, the whole
    # mini-batch on a GPU with room), a number is a ceiling (lowered, with one warning line, when
    # the estimate says it cannot fit), 0 = no cut.
    mini_batches: int = 1
    ppo_epochs: int = 1
    micro_batch_tokens: int | Literal["auto"] = "auto"
    # Local service: lay sequences end to end in rows of at most this many tokens for the forward
    # pass (attention stays inside each sequence: block-diagonal causal mask, positions restart),
    # so short sequences stop paying for padding. 0 = one sequence a row.
    pack_tokens: int = 0
    shuffle_seed: int | None = None  # shuffle sequences before cutting mini-batches (None = keep order)
    # local service
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"  # auto: bf16 on CUDA, fp32 on CPU
    torch_threads: int = 0  # 0 = min(cpu count, 4) on CPU
    seed: int = 0
    served_model_name: str = ""  # defaults to the model path's last component
    sampler_host: str = "127.0.0.1"
    sampler_port: int = 0  # 0 = any free port
    sampler_max_batch: int = 64  # most sequences generated together (their KV cache is the sampler's memory)
    # Most requests waiting for a place in the running batch; one more is refused at once (503,
    # naming this key) instead of held without bound. A request whose client goes away (an HTTP
    # client that disconnects, a call cancelled at its rollout's deadline) stops decoding at the
    # next step and frees its place.
    sampler_max_queued: int = 1024
    sampler_max_tokens: int = 256  # default max_tokens when a request sets none
    # A batch keeps collecting requests while they arrive less than this apart (0 = take only
    # what is already queued).
    sampler_batch_window_ms: float = 1.0
    # A gateway in this process (the engine's embedded one) hands whole calls to the sampler
    # directly instead of over HTTP (rllm.runtime.inprocess_upstreams): same answers and traces,
    # less CPU per call; the calls its loop submits in one iteration start one batch, so a step
    # runs no more forward passes than over HTTP (benchmarks/history/issue-35.md, "#35 round 7").
    # False: every call over HTTP, as a gateway in another process reaches it anyway.
    sampler_in_process: bool = True
    # "copy": the sampler owns a second copy of the weights, refreshed by sync_weights (training
    # never disturbs serving). "shared": one module; optimizer steps pause sampling (saves memory).
    # "none": no sampler at all, only training, checkpoints and held-out loss (`rllm sft`'s
    # default: no second copy of the weights, no sampler thread or HTTP server to start).
    sampler_weights: Literal["copy", "shared", "none"] = "copy"
    # The sampler copy's dtype ("same": the trainer's). "bfloat16" beside a float32 trainer samples
    # faster where the hardware multiplies bf16 (CUDA, CPUs with AMX: 1.9x on SmolLM2, 2026-12-07)
    # and costs a train/sampler logprob gap of ~0.06 nats a token, which the trainer's token truth
    # reports (benchmarks/RESULTS.md, "real_model_sampling.py"). Needs sampler_weights = "copy".
    sampler_dtype: Literal["same", "float32", "bfloat16", "float16"] = "same"
    # Decode steps of Llama-family text models (llama, mistral, qwen2, qwen3) on the CPU run
    # rLLM's own step (local/fast_decode.py: fused projections, merged LoRA, pre-packed bf16
    # weights) instead of transformers' forward; same tokens up to float rounding. It holds one
    # more copy of the weights (merged, packed). False: transformers' forward for every step.
    sampler_fast_decode: bool = True
    # Local service: decoder layers keep only their input for backward and recompute the rest
    # (about a third more compute, a fraction of the activation memory). "auto": on when the
    # memory estimate says the micro-batch would otherwise have to shrink below its target.
    gradient_checkpointing: bool | Literal["auto"] = "auto"
    # Local service: the loss's logprobs take the full-vocabulary logits this many positions at a
    # time (local/logprobs.py); "auto": about 64 MiB of float32 logits on CPU, 512 MiB on CUDA.
    logits_chunk_tokens: int | Literal["auto"] = "auto"
    # Local service: the most memory (GiB) a training step may plan for (resident on CPU, torch's
    # allocations on CUDA); 0 = what the process holds plus 90% of what is free at the first step.
    memory_limit_gb: float = 0.0
    # remote service
    remote: RemoteConfig = msgspec.field(default_factory=RemoteConfig)

    def __post_init__(self) -> None:
        checks = [
            (self.mini_batches >= 1, "mini_batches", "must be >= 1"),
            (self.ppo_epochs >= 1, "ppo_epochs", "must be >= 1"),
            (
                self.micro_batch_tokens == "auto" or self.micro_batch_tokens >= 0,
                "micro_batch_tokens",
                'must be >= 0 or "auto"',
            ),
            (
                self.logits_chunk_tokens == "auto" or self.logits_chunk_tokens >= 1,
                "logits_chunk_tokens",
                'must be >= 1 or "auto"',
            ),
            (self.memory_limit_gb >= 0, "memory_limit_gb", "must be >= 0 (0 = what the machine has free)"),
            (self.pack_tokens >= 0, "pack_tokens", "must be >= 0"),
            *((False, key, message) for key, message in self.adamw_problems()),
            (self.lora.rank >= 0, "lora.rank", "must be >= 0"),
            (self.sampler_max_batch >= 1, "sampler_max_batch", "must be >= 1"),
            (self.sampler_max_tokens >= 1, "sampler_max_tokens", "must be >= 1"),
            (self.sampler_max_queued >= 1, "sampler_max_queued", "must be >= 1"),
            (self.torch_threads >= 0, "torch_threads", "must be >= 0"),
            (
                self.sampler_dtype == "same" or self.sampler_weights == "copy",
                "sampler_dtype",
                f'{self.sampler_dtype!r} needs the sampler\'s own weights (sampler_weights = "copy"),'
                f" not {self.sampler_weights!r}",
            ),
            # Checked here, not by torch once the model is loading (seconds later).
            (
                re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device) is not None,
                "device",
                f"{self.device!r} is not a device: auto, cpu, cuda or cuda:N",
            ),
        ]
        for ok, key, message in checks:
            if not ok:
                # parse_options prefixes the key: "backend.options.mini_batches: must be >= 1"
                raise ConfigError.for_key(key, message)


def parse_config(
    options: TinkerBackendConfig | Mapping[str, Any] | None, **overrides: Any
) -> TinkerBackendConfig:
    """A typed config from a mapping (TOML/YAML/CLI); errors read ``backend.options.KEY: ...``."""
    return parse_options(options, TinkerBackendConfig, prefix=OPTIONS, overrides=overrides)
