"""Sandbox implementations, the warm pool and the engine's per-rollout leases.

The protocol a flow sees is ``rllm.sdk.sandbox``; task directories are ``rllm.sdk.task_dir``.
"""

from rllm.engine.sandbox.bubblewrap import BubblewrapBackend, BubblewrapSandbox
from rllm.engine.sandbox.docker import DockerBackend, DockerSandbox
from rllm.engine.sandbox.pool import SandboxBackend, WarmPool
from rllm.engine.sandbox.provider import SandboxProvider, make_backend

__all__ = [
    "BubblewrapBackend",
    "BubblewrapSandbox",
    "DockerBackend",
    "DockerSandbox",
    "SandboxBackend",
    "SandboxProvider",
    "WarmPool",
    "make_backend",
]
