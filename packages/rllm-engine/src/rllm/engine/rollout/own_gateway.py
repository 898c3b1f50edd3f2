"""The gateway an engine starts for itself (in its process, each flow process, each Ray actor):
its config, and the admin key that only the engine holds (docs/architecture.md, "Gateway auth")."""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING

import msgspec

if TYPE_CHECKING:
    from rllm.gateway import GatewayConfig


def owned_gateway_config(
    gateway_config: GatewayConfig | None, upstreams: list[str], admin_key: str | None
) -> GatewayConfig:
    """The GatewayConfig of the gateway an engine starts: ``gateway_config`` (else the default
    for ``upstreams``) with an admin key: its own, else ``admin_key``, else a fresh random one.

    The key is made here, in the engine that owns the gateway (the driver, with worker processes
    or Ray actors: they get this config, so one key opens every worker's gateway), and goes
    nowhere else: not into the environment, an AgentConfig, a log line (``repr`` hides it)."""
    cfg = gateway_config if gateway_config is not None else default_gateway_config(upstreams, admin_key)
    if cfg.admin_key is None:
        cfg = msgspec.structs.replace(cfg, admin_key=admin_key or secrets.token_urlsafe(32))
    return cfg


def default_gateway_config(upstreams: list[str], admin_key: str | None) -> GatewayConfig:
    """The GatewayConfig of an engine's own gateway when the caller gives only upstreams."""
    from rllm.gateway import GatewayConfig

    # No auto-created sessions: a sync flow still running after its deadline (its session
    # deleted) must get a fast 410 (ended), not silently start a new, orphaned session.
    # Health checks every 2 s, so a worker marked failed is back by the second retry
    # (backoff 1 s, then 2 s) instead of failing every retry with 503.
    return GatewayConfig(
        upstreams=upstreams, admin_key=admin_key, auto_create_sessions=False, health_interval_s=2.0
    )
