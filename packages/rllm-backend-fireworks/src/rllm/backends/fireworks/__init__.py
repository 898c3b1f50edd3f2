"""rllm.backends.fireworks: train on Fireworks through the official fireworks-ai training SDK."""

from rllm.backends.fireworks.backend import FireworksBackend
from rllm.backends.fireworks.config import FireworksBackendConfig, parse_config

__all__ = ["FireworksBackend", "FireworksBackendConfig", "parse_config"]
