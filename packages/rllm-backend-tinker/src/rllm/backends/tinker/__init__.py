"""rllm.backends.tinker: the Tinker-API training backend (local in-process service or remote SDK)."""

from rllm.backends.tinker.backend import TinkerBackend
from rllm.backends.tinker.config import LoraConfig, RemoteConfig, TinkerBackendConfig, parse_config

__all__ = ["LoraConfig", "RemoteConfig", "TinkerBackend", "TinkerBackendConfig", "parse_config"]
