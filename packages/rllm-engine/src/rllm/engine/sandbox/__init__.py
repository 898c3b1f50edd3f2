"""Sandbox implementations (the protocol a flow sees is ``rllm.sdk.sandbox``)."""

from rllm.engine.sandbox.bubblewrap import BubblewrapBackend, BubblewrapSandbox

__all__ = ["BubblewrapBackend", "BubblewrapSandbox"]
