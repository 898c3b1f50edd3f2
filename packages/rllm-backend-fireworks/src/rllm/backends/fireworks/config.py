"""FireworksBackendConfig: the typed ``backend.options`` of the Fireworks backend.

The API key is not an option: it comes from ``FIREWORKS_API_KEY`` only, so it never lands in a
config file, a checkpoint or a log line.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from rllm.algos.optim import AdamWSettings
from rllm.types.config_file import parse_options
from rllm.types.errors import ConfigError

API_KEY_ENV = "FIREWORKS_API_KEY"
OPTIONS = "backend.options"
_SHAPE_RE = re.compile(r"^accounts/[^/]+/trainingShapes/[^/]+(/versions/[^/]+)?$")
_ID_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


class FireworksBackendConfig(AdamWSettings, kw_only=True, forbid_unknown_fields=True):
    """Where and what to train. Empty ids mean "create one"; set ids attach to existing resources
    (which ``close()`` then leaves alone). The optimizer keys (``learning_rate``, ``weight_decay``,
    ``betas``, ``eps``, ``grad_clip``: AdamW, one optim_step per mini-batch) are rllm.algos'
    AdamWSettings, with its defaults."""

    model: str = ""  # the base model, e.g. "accounts/fireworks/models/qwen3-0p6b"
    account: str = ""  # optional: checked against the account the API key resolves to
    lora_rank: int = 16  # 0 = full-parameter training
    # Training shape: a full resource name ("accounts/<a>/trainingShapes/<s>[/versions/<v>]");
    # empty lets the service pick a validated shape for the model, LoRA rank and region.
    training_shape: str = ""
    trainer_job_id: str = ""  # attach to this RLOR trainer job instead of creating one
    deployment_id: str = ""  # attach to (or create under) this id; empty: "rllm-<trainer job id>"
    deployment_shape: str = ""  # the deployment's shape when one is created (empty: the service's)
    region: str = ""  # e.g. "US_VIRGINIA_1"; empty: the service chooses
    hot_load_timeout_s: int = 600  # how long a weight sync waits for the deployment to load it
    # Where the service lives; tests point these at a loopback fake.
    base_url: str = "https://api.fireworks.ai"
    inference_url: str = ""  # OpenAI-compatible root of the deployment; empty: base_url + /inference/v1
    # A Hugging Face tokenizer (id or local path) of the base model: turns on the gateway's
    # cumulative mode (token-level multi-turn bridging). Empty: plain capture, ids from raw_output.
    tokenizer: str = ""
    mini_batches: int = 1
    ppo_epochs: int = 1
    shuffle_seed: int | None = None
    seed: int = 0
    checkpoint_prefix: str = "rllm"
    request_timeout_s: float = 1800.0  # bound on every wait for a training call
    poll_interval_s: float = 5.0  # control-plane polling (trainer and deployment readiness)
    trainer_ready_timeout_s: float = 3600.0
    # Delete the trainer job and deployment this backend created when it closes.
    cleanup_on_close: bool = True

    def __post_init__(self) -> None:
        checks = [
            (bool(self.model), "model", "is empty: give the Fireworks base model name"),
            (self.lora_rank >= 0, "lora_rank", "must be >= 0 (0 = full-parameter training)"),
            (
                not self.training_shape or bool(_SHAPE_RE.match(self.training_shape)),
                "training_shape",
                "must be a full resource name 'accounts/<account>/trainingShapes/<shape>'",
            ),
            (
                not self.deployment_id or bool(_ID_RE.match(self.deployment_id)),
                "deployment_id",
                "must be lowercase letters, digits and '-' (at most 63)",
            ),
            (self.hot_load_timeout_s > 0, "hot_load_timeout_s", "must be > 0"),
            *((False, key, message) for key, message in self.adamw_problems()),
            (self.mini_batches >= 1, "mini_batches", "must be >= 1"),
            (self.ppo_epochs >= 1, "ppo_epochs", "must be >= 1"),
            (self.request_timeout_s > 0, "request_timeout_s", "must be > 0"),
            (self.poll_interval_s > 0, "poll_interval_s", "must be > 0"),
            (self.base_url.startswith(("http://", "https://")), "base_url", "must be an http(s) URL"),
        ]
        for ok, key, message in checks:
            if not ok:
                # parse_options prefixes the key: "backend.options.model: is empty: ..."
                raise ConfigError.for_key(key, message)

    def resolved_inference_url(self) -> str:
        return (self.inference_url or f"{self.base_url.rstrip('/')}/inference/v1").rstrip("/")


def parse_config(
    options: FireworksBackendConfig | Mapping[str, Any] | None, **overrides: Any
) -> FireworksBackendConfig:
    """A typed config from a mapping (TOML/YAML/CLI); errors read ``backend.options.KEY: ...``."""
    for given in (options if isinstance(options, Mapping) else {}), overrides:
        if "api_key" in given:
            key = f"{OPTIONS}.api_key"
            raise ConfigError(f"{key}: not an option: set the {API_KEY_ENV} environment variable", key)
    return parse_options(options, FireworksBackendConfig, prefix=OPTIONS, overrides=overrides)


def api_key() -> str:
    key = os.environ.get(API_KEY_ENV, "")
    if not key:
        raise ConfigError(f"the fireworks backend needs an API key: set {API_KEY_ENV}")
    return key
