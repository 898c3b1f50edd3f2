"""Upstream inference servers (the admin API's "upstreams"): sticky-per-session routing,
least-loaded fallback, health checks.

A session sticks to one upstream so its multi-turn prefix stays in that upstream's KV cache. When
that upstream is unhealthy or removed, the session moves to the least-loaded healthy upstream.

"Unhealthy" is a hint, not a verdict: a probe can time out because the upstream is busy, not down.
When no upstream is marked healthy, requests still go to the one whose last failure is oldest; an
upstream that is really down refuses the connection at once (and is excluded for that request),
one that answers is marked healthy again. So one slow probe never locks every request out.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from rllm.types.errors import InputError, RLLMError


class NoHealthyUpstream(RLLMError):
    """No upstream can take the request (all down, or none configured)."""


@dataclass(slots=True)
class Upstream:
    """One upstream inference server (an OpenAI-compatible base URL) and what is known of it."""

    url: str
    healthy: bool = True
    inflight: int = 0
    requests: int = 0
    failures: int = 0
    last_check: float = 0.0
    last_error: str | None = None
    failed_at: float = 0.0  # monotonic time of the last failure (probe or request)
    models: list[str] | None = None

    def info(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "healthy": self.healthy,
            "inflight": self.inflight,
            "requests": self.requests,
            "failures": self.failures,
            "last_check": self.last_check,
            "last_error": self.last_error,
            "models": self.models,
        }


class UpstreamPool:
    """The upstreams one gateway routes to, by URL (``upstreams``, as the admin API names them)."""

    def __init__(self, urls: list[str]) -> None:
        self.upstreams: dict[str, Upstream] = {}
        for u in urls:
            self.add(u)

    def add(self, url: str) -> Upstream:
        url = url.rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise InputError(f"upstream url must be an http(s) base URL ending in /v1, got {url!r}")
        w = self.upstreams.get(url)
        if w is None:
            w = self.upstreams[url] = Upstream(url)
        return w

    def remove(self, url: str) -> bool:
        return self.upstreams.pop(url.rstrip("/"), None) is not None

    def healthy_count(self) -> int:
        return sum(1 for w in self.upstreams.values() if w.healthy)

    def pick(self, sticky: str | None, exclude: set[str] | None = None) -> Upstream:
        """The sticky upstream if it is usable, else the least-loaded healthy one, else (none healthy)
        the one whose last failure is oldest. Raises NoHealthyUpstream only when every upstream is
        excluded (already failed this request) or none is configured."""
        if sticky is not None:
            w = self.upstreams.get(sticky)
            if w is not None and w.healthy and (exclude is None or sticky not in exclude):
                return w
        best: Upstream | None = None
        for w in self.upstreams.values():
            if not w.healthy or (exclude is not None and w.url in exclude):
                continue
            # Ties (e.g. an idle pool) go to the upstream that has served least, spreading sessions.
            if best is None or (w.inflight, w.requests) < (best.inflight, best.requests):
                best = w
        if best is not None:
            return best
        for w in self.upstreams.values():
            if exclude is not None and w.url in exclude:
                continue
            if best is None or w.failed_at < best.failed_at:
                best = w
        if best is None:
            if not self.upstreams:
                raise NoHealthyUpstream("no upstreams are configured")
            raise NoHealthyUpstream(f"no healthy upstream (of {len(self.upstreams)})")
        return best

    def mark_failed(self, w: Upstream, error: str) -> None:
        w.healthy = False
        w.failures += 1
        w.last_error = error
        w.failed_at = time.monotonic()

    @staticmethod
    def mark_answered(w: Upstream) -> None:
        """An upstream that just answered a request is up, whatever its last probe said."""
        w.healthy = True

    async def check(self, session: aiohttp.ClientSession, w: Upstream, timeout_s: float) -> None:
        """GET {url}/models: healthy if it answers 200 in time."""
        try:
            async with session.get(f"{w.url}/models", timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                raw = await resp.read()
                ok = resp.status == 200
                if ok:
                    try:
                        w.models = [m["id"] for m in json.loads(raw)["data"]]
                    except (ValueError, KeyError, TypeError):
                        w.models = None
                err = None if ok else f"/models answered {resp.status}"
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            ok, err = False, f"{type(exc).__name__}: {exc}"
        w.healthy = ok
        w.last_check = time.time()
        if err is not None:
            w.last_error = err
            w.failed_at = time.monotonic()

    async def check_all(self, session: aiohttp.ClientSession, timeout_s: float) -> None:
        await asyncio.gather(*(self.check(session, w, timeout_s) for w in list(self.upstreams.values())))

    async def health_loop(self, session: aiohttp.ClientSession, interval_s: float, timeout_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            with contextlib.suppress(Exception):
                await self.check_all(session, timeout_s=timeout_s)
