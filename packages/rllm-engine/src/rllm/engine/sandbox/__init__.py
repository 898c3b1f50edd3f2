"""Sandbox implementations, the warm pool and the engine's per-rollout leases.

The protocol a flow sees is ``rllm.sdk.sandbox``; task directories are ``rllm.sdk.task_dir``.
"""

from rllm.engine.sandbox.bubblewrap import BubblewrapBackend, BubblewrapSandbox
from rllm.engine.sandbox.docker import DockerBackend, DockerSandbox
from rllm.engine.sandbox.e2b import E2BBackend, E2BSandbox
from rllm.engine.sandbox.pool import SandboxBackend, WarmPool
from rllm.engine.sandbox.provider import SandboxProvider, make_backend

__all__ = [
    "BubblewrapBackend",
    "BubblewrapSandbox",
    "DockerBackend",
    "DockerSandbox",
    "E2BBackend",
    "E2BSandbox",
    "SandboxBackend",
    "SandboxProvider",
    "WarmPool",
    "make_backend",
]
