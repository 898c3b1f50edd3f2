"""TrainerConfig: one typed config for a training run, from TOML/YAML plus `a.b=value` overrides.

Validated up front: an unknown key, a mistyped value or an algorithm option the chosen backend
cannot honour stops the run before anything starts, with the key's dotted path in the message.
"""

from __future__ import annotations

import copy
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

import msgspec
import yaml

from rllm.algos.config import AlgorithmConfig
from rllm.types import ConfigError, SamplingParams


class RolloutSection(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    concurrency: int = 64
    workers: int = 1  # processes running flows, each with its own gateway (RolloutConfig.workers)
    deadline_s: float = 120.0
    max_retries: int = 1
    sampling: SamplingParams = msgspec.field(default_factory=lambda: SamplingParams(temperature=1.0))
    val_sampling: SamplingParams = msgspec.field(default_factory=lambda: SamplingParams(temperature=0.0))
    sandbox_backend: str = "bubblewrap"  # for flows marked @needs_sandbox (RolloutConfig)
    sandbox_warm: int = 0


class BackendSection(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: str = "tinker"
    options: dict[str, Any] = msgspec.field(default_factory=dict)  # the backend's own typed config


class GatewaySection(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    mode: Literal["plain", "cumulative"] = "cumulative"
    store: str = "memory"


class TrainerConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    cookbook: str
    seed: int = 0
    total_steps: int = 100
    tasks_per_step: int = 8
    group_size: int = 8
    train_split: str = "train"
    val_split: str | None = None
    val_every: int = 0
    val_tasks: int | None = None
    ckpt_every: int = 0
    out_dir: str = "runs/default"
    tensorboard: bool = True
    wandb: bool = False
    plot: bool = True
    progress: bool = True
    # Groups (tasks, with all their rollouts) per step saved to OUT/samples/ for `rllm view`; 0: none.
    sample_groups: int = 2
    algorithm: AlgorithmConfig = msgspec.field(default_factory=AlgorithmConfig)
    rollout: RolloutSection = msgspec.field(default_factory=RolloutSection)
    backend: BackendSection = msgspec.field(default_factory=BackendSection)
    gateway: GatewaySection = msgspec.field(default_factory=GatewaySection)

    def __post_init__(self) -> None:
        for name in ("total_steps", "tasks_per_step", "group_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("val_every", "ckpt_every", "sample_groups"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0 (0 turns it off), got {getattr(self, name)}")
        if self.val_every and not self.val_split:
            raise ConfigError("val_every is set but val_split is not: name the split to validate on")


def load_config(
    path: str | Path | None, overrides: list[str] = (), base: dict[str, Any] | None = None
) -> TrainerConfig:
    """Read a TOML or YAML file (optional), apply ``key.sub=value`` overrides, validate."""
    doc: dict[str, Any] = copy.deepcopy(base or {})  # overrides must never edit the caller's defaults
    if path is not None:
        doc = _merge(doc, read_config_file(Path(path)))
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} is not of the form key.sub=value")
        _set_dotted(doc, key.strip(), yaml.safe_load(raw) if raw.strip() else "")
    return config_from_dict(doc)


def config_from_dict(doc: dict[str, Any]) -> TrainerConfig:
    try:
        return msgspec.convert(doc, TrainerConfig)
    except msgspec.ValidationError as exc:
        message, _, where = str(exc).rpartition(" - at `")
        if not message:
            message, where = str(exc), ""
        key = where.rstrip("`").removeprefix("$").removeprefix(".")
        if unknown := re.fullmatch(r"Object contains unknown field `(.+)`", message):
            key = f"{key}.{unknown[1]}" if key else unknown[1]
            message = "unknown key"
        raise ConfigError(f"config key `{key}`: {message}" if key else message) from None


def read_config_file(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    text = path.read_text()
    try:
        doc = tomllib.loads(text) if path.suffix == ".toml" else yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"config file {path} is not valid {path.suffix[1:].upper()}: {exc}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return doc


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = (
            _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


def _set_dotted(doc: dict[str, Any], key: str, value: Any) -> None:
    *parents, leaf = key.split(".")
    node = doc
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {key!r}: `{part}` is a value, not a section")
        node = child
    node[leaf] = value
