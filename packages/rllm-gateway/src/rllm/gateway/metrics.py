"""Prometheus metrics of one gateway (its own registry, so several gateways can share a process)."""

from __future__ import annotations

from collections.abc import Sized
from typing import TYPE_CHECKING, Protocol

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

if TYPE_CHECKING:
    from rllm.gateway.store import TraceStore
    from rllm.gateway.upstreams import UpstreamPool
    from rllm.types import TraceRecord


class MeteredGateway(Protocol):
    """What the gauges read from their gateway at scrape time (``GatewayServer`` is one)."""

    @property
    def inflight(self) -> int: ...

    @property
    def store(self) -> TraceStore: ...

    @property
    def sessions(self) -> Sized: ...

    @property
    def pool(self) -> UpstreamPool: ...


class GatewayMetrics:
    def __init__(self, server: MeteredGateway) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.calls = Counter(
            "rllm_gateway_llm_calls", "LLM calls proxied, by trace status", ["status"], registry=r
        )
        self.latency = Histogram(
            "rllm_gateway_llm_call_seconds",
            "Latency of proxied LLM calls (gateway in to last byte)",
            registry=r,
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300),
        )
        self.completion_tokens = Counter(
            "rllm_gateway_completion_tokens", "Completion tokens captured", registry=r
        )
        self.prompt_tokens = Counter("rllm_gateway_prompt_tokens", "Prompt tokens captured", registry=r)
        self.retries = Counter(
            "rllm_gateway_upstream_retries", "Requests retried on another upstream", registry=r
        )
        # Read from the server at scrape time: no lock-taking inc/dec on every request.
        inflight = Gauge("rllm_gateway_inflight_requests", "Requests being proxied now", registry=r)
        inflight.set_function(lambda: server.inflight)
        self.weight_version = Gauge("rllm_gateway_weight_version", "Current weight version", registry=r)
        stored = Gauge("rllm_gateway_store_traces", "Traces held by the trace store", registry=r)
        stored.set_function(lambda: server.store.trace_count())
        sessions = Gauge("rllm_gateway_sessions", "Open sessions", registry=r)
        sessions.set_function(lambda: len(server.sessions))
        healthy = Gauge("rllm_gateway_healthy_upstreams", "Upstreams passing health checks", registry=r)
        healthy.set_function(lambda: server.pool.healthy_count())
        upstreams = Gauge("rllm_gateway_upstreams", "Upstreams configured", registry=r)
        upstreams.set_function(lambda: len(server.pool.upstreams))
        self._status_children = {s: self.calls.labels(status=s) for s in ("ok", "abort", "error")}
        # Per-call counts are summed in plain ints and moved into the prometheus counters at
        # scrape time (or every _FLUSH_EVERY calls): each prometheus inc takes a lock.
        self._pending_status: dict[str, int] = dict.fromkeys(self._status_children, 0)
        self._pending_completion = 0
        self._pending_prompt = 0
        self._pending_calls = 0
        self._pending_latencies: list[float] = []  # (the histogram's observe takes locks too)

    _FLUSH_EVERY = 512

    def observe(self, trace: TraceRecord) -> None:
        self._pending_status[trace.status] += 1
        self._pending_latencies.append(trace.latency_s)
        if trace.completion_ids is not None:
            self._pending_completion += len(trace.completion_ids)
        if trace.prompt_ids is not None:
            self._pending_prompt += len(trace.prompt_ids)
        self._pending_calls += 1
        if self._pending_calls >= self._FLUSH_EVERY:
            self.flush()

    def flush(self) -> None:
        """Move the summed per-call counts into the prometheus counters."""
        for status, n in self._pending_status.items():
            if n:
                self._status_children[status].inc(n)
                self._pending_status[status] = 0
        if self._pending_completion:
            self.completion_tokens.inc(self._pending_completion)
            self._pending_completion = 0
        if self._pending_prompt:
            self.prompt_tokens.inc(self._pending_prompt)
            self._pending_prompt = 0
        self._pending_calls = 0
        latencies, self._pending_latencies = self._pending_latencies, []
        for seconds in latencies:
            self.latency.observe(seconds)

    def render(self) -> tuple[bytes, str]:
        self.flush()
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


__all__ = ["GatewayMetrics", "MeteredGateway"]
