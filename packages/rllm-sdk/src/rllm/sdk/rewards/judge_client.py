"""One judge model behind any OpenAI-compatible endpoint: concurrency-limited, cached, accounted.

Every judge in ``rllm.sdk.rewards`` (``LLMJudge``, ``RubricJudge``, ``GroupJudge``) asks its
model through a :class:`JudgeEndpoint`:

- ``ask(messages, parse)`` sends one chat request (at most ``max_concurrency`` at once per event
  loop), hands the reply text to ``parse`` and returns the parsed value. A reply ``parse``
  refuses raises :class:`JudgeReplyError` (an ``InfraError``) carrying the reply: a judge that
  did not answer in the format is a broken instrument, never a score of 0.
- Accepted replies are cached by a hash of the request (:mod:`rllm.sdk.rewards.judge_cache`).
- Tokens and cost are counted per call (:class:`CallUsage`, what an evaluator reports on its
  episode as ``judge/*`` signals) and in total (:class:`JudgeUsage`, ``endpoint.usage``).
- ``check()`` asks the endpoint's ``/models`` once, so a run whose judge is down or does not
  serve the model is refused before it starts.

Needs ``openai`` (``rllm-sdk[judge]``), imported on first use.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import msgspec

from rllm.sdk.errors import InfraError
from rllm.sdk.rewards.judge_cache import CachedReply, JudgeCache, cache_key
from rllm.types import Signal
from rllm.types.errors import ConfigError, InputError, MissingExtraError

T = TypeVar("T")
REPLY_TAIL = 400  # characters of a refused reply kept in the error message


class JudgeReplyError(InfraError):
    """The judge answered, but not in the format its prompt asks for. ``reply`` is what it said."""

    def __init__(self, reason: str, reply: str) -> None:
        super().__init__(f"judge reply refused: {reason}; the reply ends: {reply[-REPLY_TAIL:]!r}")
        self.reason = reason
        self.reply = reply


class JudgeUnavailable(InfraError):
    """The judge endpoint cannot be reached, or does not serve the judge's model."""


class CallUsage(msgspec.Struct, frozen=True):
    """What one judge request cost: ``calls`` is 1 when the endpoint was asked, ``cache_hits`` 1
    when the cache answered. Floats, so a group call's cost can be shared among its members."""

    calls: float = 0.0
    cache_hits: float = 0.0
    prompt_tokens: float = 0.0
    completion_tokens: float = 0.0
    cost_usd: float = 0.0

    def share(self, parts: int) -> CallUsage:
        """This usage split evenly over ``parts`` episodes (a group call's share of each member):
        the episodes' ``judge/*`` signals then add up to the call's own usage."""
        k = float(max(1, parts))
        return CallUsage(
            calls=self.calls / k,
            cache_hits=self.cache_hits / k,
            prompt_tokens=self.prompt_tokens / k,
            completion_tokens=self.completion_tokens / k,
            cost_usd=self.cost_usd / k,
        )

    def signals(self, prefix: str = "judge/") -> list[Signal]:
        """The ``judge/*`` signals an evaluator puts on its EvalOutput (the trainer logs their mean)."""
        return [
            Signal(name=f"{prefix}calls", value=self.calls),
            Signal(name=f"{prefix}cache_hits", value=self.cache_hits),
            Signal(name=f"{prefix}prompt_tokens", value=self.prompt_tokens),
            Signal(name=f"{prefix}completion_tokens", value=self.completion_tokens),
            Signal(name=f"{prefix}cost_usd", value=self.cost_usd),
        ]


class JudgeUsage:
    """Totals over every request of one endpoint (thread-safe): calls made, cache hits, refused
    replies, endpoint failures, tokens, cost and the seconds spent waiting on the endpoint."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.calls = self.cache_hits = self.refused = self.failed = 0
        self.prompt_tokens = self.completion_tokens = 0
        self.cost_usd = 0.0
        self.call_seconds = 0.0

    def add(self, usage: CallUsage, *, refused: bool = False, seconds: float = 0.0) -> None:
        with self._lock:
            self.calls += int(usage.calls)
            self.cache_hits += int(usage.cache_hits)
            self.refused += int(refused)
            self.prompt_tokens += int(usage.prompt_tokens)
            self.completion_tokens += int(usage.completion_tokens)
            self.cost_usd += usage.cost_usd
            self.call_seconds += seconds

    def add_failure(self) -> None:
        with self._lock:
            self.failed += 1

    @property
    def requests(self) -> int:
        return self.calls + self.cache_hits

    @property
    def cache_hit_rate(self) -> float:
        return self.cache_hits / self.requests if self.requests else 0.0

    def as_dict(self) -> dict[str, float]:
        with self._lock:
            return {
                "calls": float(self.calls),
                "cache_hits": float(self.cache_hits),
                "cache_hit_rate": self.cache_hit_rate,
                "refused": float(self.refused),
                "failed": float(self.failed),
                "prompt_tokens": float(self.prompt_tokens),
                "completion_tokens": float(self.completion_tokens),
                "cost_usd": self.cost_usd,
            }


@dataclass(frozen=True)
class JudgeAnswer(Generic[T]):
    """A parsed judge reply, its text and what the request cost."""

    value: T
    reply: str
    usage: CallUsage


class JudgeEndpoint:
    """A judge model at ``base_url`` (any OpenAI-compatible ``/v1``: vLLM, ``rllm serve``, a
    hosted API, a LiteLLM proxy). ``api_key_env`` names the variable holding the key, so keys stay
    out of configs. ``price_per_mtok`` is (prompt, completion) US dollars per million tokens.
    ``cache``: a :class:`JudgeCache`, a SQLite file path, or None for an in-memory cache."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        api_key_env: str | None = None,
        max_concurrency: int = 8,
        temperature: float = 0.0,
        max_tokens: int = 512,
        timeout_s: float = 60.0,
        price_per_mtok: tuple[float, float] = (0.0, 0.0),
        cache: JudgeCache | str | Path | None = None,
    ) -> None:
        if not base_url or not model:
            raise InputError("a judge endpoint needs base_url and model")
        if max_concurrency < 1:
            raise InputError(f"judge max_concurrency must be >= 1, got {max_concurrency}")
        if min(price_per_mtok) < 0:
            raise InputError(f"judge price_per_mtok must be >= 0, got {price_per_mtok}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key_env = api_key_env
        self._api_key = api_key
        self.max_concurrency = max_concurrency
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.timeout_s = timeout_s
        self.price_per_mtok = (float(price_per_mtok[0]), float(price_per_mtok[1]))
        self.cache = cache if isinstance(cache, JudgeCache) else JudgeCache(cache)
        self.usage = JudgeUsage()
        self._per_loop: dict[int, tuple[Any, asyncio.Semaphore]] = {}

    def __getstate__(self) -> dict[str, Any]:
        # A copy in a flow worker process starts with no clients (they belong to this process's
        # loops) and a tally of its own (a lock does not pickle).
        return {k: v for k, v in self.__dict__.items() if k not in ("_per_loop", "usage")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._per_loop = {}
        self.usage = JudgeUsage()

    @property
    def api_key(self) -> str:
        if self._api_key is not None:
            return self._api_key
        if self.api_key_env:
            key = os.environ.get(self.api_key_env)
            if not key:
                raise ConfigError(f"the judge's API key variable {self.api_key_env} is not set")
            return key
        return "EMPTY"

    def _loop_state(self) -> tuple[Any, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        state = self._per_loop.get(id(loop))
        if state is None:
            try:
                from openai import AsyncOpenAI
            except ImportError as exc:  # pragma: no cover - depends on the install
                raise MissingExtraError("LLM judges need openai: pip install 'rllm-sdk[judge]'") from exc
            client = AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, timeout=self.timeout_s)
            state = (client, asyncio.Semaphore(self.max_concurrency))
            self._per_loop[id(loop)] = state
        return state

    def request(self, messages: Sequence[dict[str, Any]], max_tokens: int | None = None) -> dict[str, Any]:
        """The chat request body ``ask`` sends (also what the cache key hashes)."""
        return {
            "model": self.model,
            "messages": list(messages),
            "temperature": self.temperature,
            "max_tokens": self.max_tokens if max_tokens is None else max_tokens,
        }

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        p, c = self.price_per_mtok
        return (prompt_tokens * p + completion_tokens * c) / 1e6

    async def ask(
        self, messages: Sequence[dict[str, Any]], parse: Callable[[str], T], *, max_tokens: int | None = None
    ) -> JudgeAnswer[T]:
        """Ask (or answer from the cache), parse, and account. ``parse`` raises ValueError to
        refuse a reply; that becomes a :class:`JudgeReplyError` and the reply is not cached."""
        body = self.request(messages, max_tokens)
        key = cache_key({"base_url": self.base_url, **body})
        cached = self.cache.get(key)
        if cached is not None:
            usage = CallUsage(cache_hits=1.0)
            self.usage.add(usage)
            return JudgeAnswer(parse(cached.reply), cached.reply, usage)
        client, slots = self._loop_state()
        async with slots:
            started = time.monotonic()
            try:
                completion = await client.chat.completions.create(**body)
            except Exception as exc:
                self.usage.add_failure()
                raise JudgeUnavailable(f"judge {self.model} at {self.base_url} failed: {exc}") from exc
            seconds = time.monotonic() - started
        reply = (completion.choices[0].message.content or "") if completion.choices else ""
        tokens = getattr(completion, "usage", None)
        prompt_tokens = int(getattr(tokens, "prompt_tokens", 0) or 0)
        completion_tokens = int(getattr(tokens, "completion_tokens", 0) or 0)
        usage = CallUsage(
            calls=1.0,
            prompt_tokens=float(prompt_tokens),
            completion_tokens=float(completion_tokens),
            cost_usd=self.cost(prompt_tokens, completion_tokens),
        )
        try:
            value = parse(reply)
        except ValueError as exc:
            self.usage.add(usage, refused=True, seconds=seconds)
            raise JudgeReplyError(str(exc), reply) from None
        self.usage.add(usage, seconds=seconds)
        self.cache.put(key, CachedReply(reply, prompt_tokens, completion_tokens))
        return JudgeAnswer(value, reply, usage)

    def check(self, timeout_s: float = 10.0) -> None:
        """Refuse a judge that cannot answer: the endpoint unreachable or failing, or a model list
        that does not name ``model``. An endpoint without ``/models`` (404) passes: nothing to check."""
        try:
            from openai import APIStatusError, OpenAI
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise MissingExtraError("LLM judges need openai: pip install 'rllm-sdk[judge]'") from exc
        client = OpenAI(base_url=self.base_url, api_key=self.api_key, timeout=timeout_s, max_retries=0)
        try:
            served = [m.id for m in client.models.list()]
        except APIStatusError as exc:
            if exc.status_code in (404, 405):
                return
            raise JudgeUnavailable(
                f"judge endpoint {self.base_url} answered /models with HTTP {exc.status_code}"
            ) from None
        except Exception as exc:
            raise JudgeUnavailable(f"judge endpoint {self.base_url} is unreachable: {exc}") from None
        finally:
            client.close()
        if served and self.model not in served:
            raise JudgeUnavailable(
                f"judge endpoint {self.base_url} does not serve model {self.model!r} (it serves {served[:10]})"
            )

    async def aclose(self) -> None:
        """Close this loop's client (clients of other loops are dropped with their loops)."""
        state = self._per_loop.pop(id(asyncio.get_running_loop()), None)
        self._per_loop.clear()
        if state is not None:
            await state[0].close()
