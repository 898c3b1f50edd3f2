"""GatewayConfig: every knob of the gateway, typed, loadable from TOML/YAML/JSON and CLI flags."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any, Literal

import msgspec

from rllm.gateway.policy_routes import policy_problems
from rllm.types import InvariantError, SamplingParams
from rllm.types.config_file import convert_config, read_config_file
from rllm.types.images import ImageLimits


class GatewayConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Configuration of one gateway process.

    ``store`` is ``"memory"`` or ``"sqlite:/path/file.db"``. ``tokenizer_path`` with
    ``tokenizer_mode="cumulative"`` turns on token-level bridging of multi-turn chats (see
    :mod:`rllm.gateway.cumulative`); ``"plain"`` forwards chat requests as they come.
    ``hosted_model`` sends requests through LiteLLM (e.g. ``"openai/gpt-4o-mini"``) instead of
    the ``upstreams``; traces then hold text and usage but no token ids. ``gc_gen0_threshold``
    is the young-generation GC threshold ``rllm-gateway serve`` sets for its process (see
    :mod:`rllm.runtime.gc_threshold`; None leaves the collector alone); an embedded gateway
    does not touch its host process's collector.

    ``admin_key`` guards the admin routes (sessions, every session's traces, weight version,
    pause, upstreams); without one they are open to anyone who can reach the gateway, so a
    gateway on an address other than loopback needs one unless ``insecure_no_admin_key`` says
    that is meant (a private network). An engine's own gateway always has one (a fresh key the
    engine keeps to itself). ``repr()`` hides the secrets (``admin_key``, ``hosted_api_key``).
    """

    host: str = "127.0.0.1"
    port: int = 0
    upstreams: list[str] = msgspec.field(default_factory=list)
    store: str = "memory"
    admin_key: str | None = None
    # Serve open admin routes on an address other than loopback (refused without it).
    insecure_no_admin_key: bool = False
    session_auth: bool = False
    auto_create_sessions: bool = True
    max_body_bytes: int = 32 * 1024 * 1024
    upstream_timeout_s: float = 600.0
    connect_timeout_s: float = 5.0
    tokenizer_path: str | None = None
    tokenizer_mode: Literal["plain", "cumulative"] = "plain"
    health_interval_s: float = 5.0
    # A probe's own timeout, independent of the interval: a short interval must not turn one slow
    # /models answer under load into "upstream down".
    health_timeout_s: float = 5.0
    max_connections_per_upstream: int = 1024
    retries: int = 2
    store_raw: bool = False
    sqlite_batch_ms: float = 5.0
    default_sampling: SamplingParams | None = None
    hosted_model: str | None = None
    hosted_api_key: str | None = None
    hosted_api_base: str | None = None
    model_name: str | None = None
    # Several policies (rllm.gateway.policy_routes): each policy's served model name, and the
    # policy each role trains (unmapped roles: "default").
    policies: dict[str, str] = msgspec.field(default_factory=dict)
    roles: dict[str, str] = msgspec.field(default_factory=dict)
    log_level: str = "warning"
    shutdown_timeout_s: float = 5.0
    fast_http: bool = True  # lean keep-alive client for non-streaming plain-http upstream calls
    # With fast_http: answer non-streaming calls from I/O callbacks, with no task per call
    # (rllm.gateway.proxy_lane); False runs every call in a task (for comparison or debugging).
    proxy_lane: bool = True
    # Partial rollouts (rllm.gateway.partial): a pause aborts the calls in flight (POST /abort on
    # each upstream) instead of draining them, and each is continued from its token history once
    # the gateway resumes. Streaming and n > 1 calls are refused (400) meanwhile.
    partial_rollouts: bool = False
    gc_gen0_threshold: int | None = 50_000
    # A finished or deleted session's id is remembered (at most this many, for this long) so a
    # late call for it is refused with 410 instead of re-creating the session.
    ended_session_ttl_s: float = 3600.0
    ended_session_max: int = 100_000
    # Nesting depth of JSON accepted from a client (body, messages, tools, metadata): deeper
    # documents are refused with 400 before anything recursive (validation, the store) sees them.
    max_json_depth: int = 64
    # Memory bounds: bytes of requests queued behind the one being answered on one connection,
    # the one arriving included (pipelining; reading pauses as soon as they pass it), the size of a whole upstream answer, and of one
    # streamed SSE event (502 / an error event past them).
    max_pipelined_bytes: int = 64 * 1024 * 1024
    max_upstream_body_bytes: int = 256 * 1024 * 1024
    max_stream_event_bytes: int = 16 * 1024 * 1024
    # Images in data URIs (rllm.types.images): decoded bytes and width x height per image, and
    # the Pillow formats accepted; anything else is refused with a 400 naming the content block.
    max_image_bytes: int = 20 * 1024 * 1024
    max_image_pixels: int = 40_000_000
    image_formats: list[str] = msgspec.field(default_factory=lambda: ["PNG", "JPEG", "GIF", "WEBP"])
    # Renamed key (the gateway says "upstreams" throughout): read only to refuse it by its new name.
    _old_max_connections_per_worker: int | None = msgspec.field(
        default=None, name="max_connections_per_worker"
    )

    def __post_init__(self) -> None:
        if self._old_max_connections_per_worker is not None:
            raise InvariantError(
                "renamed to max_connections_per_upstream; use that key", "max_connections_per_worker"
            )
        if not (0 <= self.port <= 65535):
            raise InvariantError(f"port must be in 0..65535, got {self.port}", "port")
        if self.store != "memory" and not self.store.startswith("sqlite:"):
            raise InvariantError(
                f"store must be 'memory' or 'sqlite:/path/file.db', got {self.store!r}", "store"
            )
        if self.store.startswith("sqlite:") and not self.store[len("sqlite:") :]:
            raise InvariantError("sqlite store needs a path: 'sqlite:/path/file.db'", "store")
        for i, url in enumerate(self.upstreams):
            if not url.startswith(("http://", "https://")):
                raise InvariantError(
                    f"upstream must be an http(s) base URL ending in /v1, got {url!r}", f"upstreams[{i}]"
                )
        self.upstreams = [u.rstrip("/") for u in self.upstreams]
        if self.max_body_bytes < 1024:
            raise InvariantError(
                f"max_body_bytes must be >= 1024, got {self.max_body_bytes}", "max_body_bytes"
            )
        if self.upstream_timeout_s <= 0:
            raise InvariantError("upstream_timeout_s must be > 0", "upstream_timeout_s")
        if self.health_timeout_s <= 0:
            raise InvariantError(
                f"health_timeout_s must be > 0, got {self.health_timeout_s}", "health_timeout_s"
            )
        if self.tokenizer_mode == "cumulative" and not self.tokenizer_path:
            raise InvariantError("tokenizer_mode='cumulative' needs tokenizer_path", "tokenizer_path")
        if self.partial_rollouts and self.hosted_model:
            raise InvariantError(
                "partial_rollouts aborts and continues calls on the upstreams' sampler; a hosted "
                "model cannot be aborted and continued token for token",
                "partial_rollouts",
            )
        for key, message in policy_problems(self.policies, self.roles):
            raise InvariantError(message, key)
        if self.policies and self.model_name:
            raise InvariantError(
                "policies name each call's model; model_name would override them", "model_name"
            )
        if self.gc_gen0_threshold is not None and self.gc_gen0_threshold < 1:
            raise InvariantError(
                f"gc_gen0_threshold must be >= 1 or None, got {self.gc_gen0_threshold}",
                "gc_gen0_threshold",
            )
        for name in (
            "ended_session_ttl_s",
            "max_json_depth",
            "max_pipelined_bytes",
            "max_upstream_body_bytes",
            "max_stream_event_bytes",
            "max_image_bytes",
            "max_image_pixels",
        ):
            if getattr(self, name) <= 0:
                raise InvariantError(f"{name} must be > 0, got {getattr(self, name)}", name)
        if self.ended_session_max < 0:
            raise InvariantError(
                f"ended_session_max must be >= 0, got {self.ended_session_max}", "ended_session_max"
            )
        if not self.image_formats:
            raise InvariantError("image_formats must name at least one format", "image_formats")
        self.image_formats = [f.upper() for f in self.image_formats]
        if self.admin_key == "":
            self.admin_key = None
        if self.admin_key is None and not self.insecure_no_admin_key and not is_loopback(self.host):
            raise InvariantError(
                f"host {self.host!r} is not a loopback address: set admin_key (--admin-key or "
                "RLLM_GATEWAY_ADMIN_KEY), or insecure_no_admin_key (--insecure-no-admin-key) to "
                "open the admin routes to the network on purpose",
                "admin_key",
            )

    def __repr__(self) -> str:
        # A config may end up in a log line or an error message: never with its secrets.
        fields = ", ".join(
            f"{name}={_shown(name, getattr(self, name))}"
            for name in self.__struct_fields__
            if not name.startswith("_")
        )
        return f"GatewayConfig({fields})"


def _shown(name: str, value: Any) -> str:
    return "<hidden>" if name in _SECRETS and value is not None else repr(value)


_SECRETS = frozenset({"admin_key", "hosted_api_key"})


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) only accepts connections from this machine."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def image_limits(config: GatewayConfig) -> ImageLimits:
    """The image limits a gateway with ``config`` applies to data-URI images."""
    return ImageLimits(
        max_bytes=config.max_image_bytes,
        max_pixels=config.max_image_pixels,
        formats=tuple(config.image_formats),
    )


def load_config(path: str | Path | None = None, **overrides: Any) -> GatewayConfig:
    """Read a TOML, YAML or JSON file (by suffix, see :mod:`rllm.types.config_file`), then apply
    ``overrides``.

    Overrides whose value is None are ignored so CLI flags that were not given do not mask
    the file. A bad field raises ConfigError naming the field (and the file).
    """
    data: dict[str, Any] = {}
    if path is not None:
        data = read_config_file(path)
        data = dict(data.get("gateway", data))  # allow a [gateway] table
    data.update({k: v for k, v in overrides.items() if v is not None})
    context = f"invalid gateway config in {path}" if path is not None else "invalid gateway config"
    return convert_config(data, GatewayConfig, context=context)
