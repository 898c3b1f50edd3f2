"""Generation for the local sampler (SamplerEngine): dynamic batching of requests over one model,
with a KV cache. (Token choice from the logits is `sampling.py`; the HTTP front is `server.py`.)

A worker thread takes every queued request (up to ``max_batch`` sequences), left-pads the
prompts into one batch and decodes them together with ``past_key_values``. Text requests arriving
meanwhile join the running batch at its next decode step (``joining.py``); each request is
answered as soon as its own sequences end; a caller on an event loop (``submit_async``) gets its
answer in one wake-up of that loop per decode step, with every other request that ended in the
step (``outbox.py``), and the requests it submits in one iteration of its loop reach the engine
together, so they start one batch. Each batch runs under
``weights_lock`` so a weight swap (``update_weights``) waits for the running batch and no
sequence mixes two weight versions; a waiting swap stops new requests from joining, so it waits
for the rows already running only.
``abort_all`` (partial rollouts, ``rollout.partial``) ends every request submitted before it at
its next decode step with ``finish_reason = "abort"`` and the tokens sampled so far, each stamped
with the version that sampled it, so a weight swap need not wait for long completions. A request
whose caller goes away (``submit_async``'s future cancelled: an HTTP client that disconnected, a
gateway call cancelled at its rollout's deadline) ends the same way at the next step, freeing its
rows. Working memory is bounded: at most ``max_batch`` sequences decode together (their KV cache),
and at most ``max_queued`` requests wait for a place; one more is refused at once
(:class:`SamplerBusy`, a 503 over HTTP) rather than held without limit.

This module is the engine's front: submitting, aborting, weight swaps and the worker thread's
loop. The parts it runs are beside it: the queue and who joins (``scheduling.py``), one batch
from prefill to last token (``decoding.py``, its prefill inputs ``prefill.py``), answering the
requests (``answering.py``), teacher scoring of given tokens (``prompt_scoring.py``), and the
request and answer types (``generation_types.py``, re-exported here).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING, cast

import torch

from rllm.backends.tinker.local import prompt_scoring
from rllm.backends.tinker.local.answering import Answers
from rllm.backends.tinker.local.decoding import BatchDecode
from rllm.backends.tinker.local.fast_decode import FastDecoder
from rllm.backends.tinker.local.generation_types import GeneratedSequence, GenerationRequest, Pending
from rllm.backends.tinker.local.scheduling import RequestQueue
from rllm.types.errors import StateError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["GeneratedSequence", "GenerationRequest", "SamplerBusy", "SamplerEngine"]

logger = logging.getLogger(__name__)


class SamplerBusy(StateError):
    """The sampler's queue is full: the request was refused, nothing of it was kept."""


class SamplerEngine:
    """Owns the sampling model; thread-safe ``submit`` returns a concurrent Future."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        device: torch.device,
        max_batch: int,
        batch_window_s: float = 0.001,
        max_queued: int = 1024,
        fast_decode: bool = True,
    ) -> None:
        self.model = model
        # Decode steps through rLLM's own step where it knows the model (fast_decode.py); it is
        # rebuilt for each weight version, so only a sampler whose weights change through
        # ``update_weights`` may use it (not sampler_weights = "shared").
        self.fast_decode = fast_decode
        self.fast: FastDecoder | None = None
        self._fast_version = -1
        self.max_queued = max_queued
        self.batch_window_s = batch_window_s
        self.tokenizer = tokenizer
        self.device = device
        self.max_batch = max_batch
        self.weights_lock = threading.Lock()
        self.weight_version = 0
        self.batches_run = 0  # observability: how many decode batches ran (tests check batching)
        self.max_batch_seen = 0
        self.busy_s = 0.0  # time spent decoding (observability: HTTP overhead = latency - busy)
        self.rows_joined = 0  # rows that joined a running batch (observability)
        self.forward_passes = 0  # model calls, prefill and decode steps (observability)
        self.rows_shared = 0  # rows whose prompt another row of the batch prefilled (observability)
        self.rows_prefix_shared = 0  # distinct prompts prefilled after a common beginning (observability)
        self.fast_prefills = 0  # those prefills whose remainders ran through the fast step's kernels
        self._requests = RequestQueue()
        self._answers = Answers(lambda ids: self.decode(ids, skip_special_tokens=True))
        self._swaps_waiting = 0  # weight swaps / pauses waiting for the lock: no joins meanwhile
        self._swaps_done = threading.Condition()
        self._thread: threading.Thread | None = None
        eos = getattr(tokenizer, "eos_token_id", None)
        self.eos_ids: set[int] = {eos} if isinstance(eos, int) else set(eos or [])
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_id: int = pad if pad is not None else next(iter(self.eos_ids), 0)
        config = getattr(model, "config", None)
        self.max_positions: int = int(getattr(config, "max_position_embeddings", 1 << 30) or (1 << 30))

    # lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="rllm-sampler-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._requests.close()
        if self._thread is not None:
            self._thread.join(timeout=30)
        # Requests still waiting would otherwise hang their HTTP clients forever.
        for p in self._requests.drain():
            self._answers.settle(p, error=StateError("sampler engine stopped before this request ran"))
        self._answers.flush()

    def _check_room(self) -> None:
        """Refuse a request when ``max_queued`` already wait (the sampler's memory stays bounded)."""
        waiting = self._requests.waiting()
        if waiting >= self.max_queued:
            raise SamplerBusy(
                f"local sampler is full: {waiting} requests already wait behind {self.max_batch} "
                f"decoding sequences (backend.options.sampler_max_queued={self.max_queued}); "
                f"lower rollout.concurrency or raise sampler_max_queued"
            )

    def submit(self, request: GenerationRequest) -> Future[list[GeneratedSequence]]:
        """Queue ``request``; the future (settled from the engine's thread) gets its sequences.
        Raises SamplerBusy when ``max_queued`` requests already wait."""
        future: Future[list[GeneratedSequence]] = Future()
        if self._requests.closed:
            future.set_exception(StateError("sampler engine is stopped"))
            return future
        self._check_room()
        self._requests.put(Pending(request, future, self._requests.aborts))
        return future

    def submit_async(self, request: GenerationRequest) -> asyncio.Future[list[GeneratedSequence]]:
        """``submit`` for a caller on a running event loop: the returned future is settled on
        that loop, together with every other request of the loop that ended in the same decode
        step (one wake-up of the loop per step, not one per request). Cancelling it (its caller
        went away) ends the request at the next decode step, or before it starts, and frees its
        rows. Raises SamplerBusy when ``max_queued`` requests already wait.

        The requests a loop submits in one iteration reach the engine together when that
        iteration ends: a gateway in this process runs a step's flows side by side on one loop
        and submits their calls one by one as it gets to each (milliseconds apart on a busy
        CPU); handed over together they start one batch, instead of a batch with the first
        and a forward pass more for each later one joining it."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[list[GeneratedSequence]] = loop.create_future()
        if self._requests.closed:
            waiter.set_exception(StateError("sampler engine is stopped"))
            return waiter
        self._check_room()
        pending = Pending(request, None, self._requests.aborts, waiter, loop)
        waiter.add_done_callback(functools.partial(self._cancelled, pending))
        self._requests.put_from_loop(pending, loop)
        return waiter

    def _cancelled(self, pending: Pending, waiter: asyncio.Future[list[GeneratedSequence]]) -> None:
        if waiter.cancelled():
            self._requests.cancel(pending)

    def abort_all(self) -> None:
        """End every request submitted before now at its next decode step (or at once, if it
        has not started) with ``finish_reason = "abort"`` and the tokens sampled so far; requests
        submitted later are not touched. A partial rollout's gateway calls this at a weight sync
        and re-sends each call's token history as a continuation on the new weights."""
        self._requests.abort_all()

    # weights ---------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _weights_held(self) -> Iterator[None]:
        """The weights lock, taken with priority over new joiners of the running batch."""
        with self._swaps_done:
            self._swaps_waiting += 1
        try:
            with self.weights_lock:
                yield
        finally:
            with self._swaps_done:
                self._swaps_waiting -= 1
                self._swaps_done.notify_all()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Hold sampling between batches (a running batch finishes first)."""
        with self._weights_held():
            yield

    def update_weights(self, apply: Callable[[], None]) -> int:
        """Run ``apply`` (which changes the sampler's weights) with sampling paused; bump version."""
        with self._weights_held():
            apply()
            self.weight_version += 1
            return self.weight_version

    # scoring (prompt_scoring.py) -------------------------------------------------------------
    def prompt_logprobs(self, token_ids: list[int]) -> list[float | None]:
        """The model's logprob of each token given the ones before it (None for the first): what
        vLLM returns as ``prompt_logprobs``; a distillation teacher scores a student's tokens so."""
        return self.prompt_logprobs_batch([token_ids])[0]

    def prompt_logprobs_batch(
        self, prompts: list[list[int]], max_tokens: int = 8192
    ) -> list[list[float | None]]:
        """``prompt_logprobs`` of many prompts, right-padded into forward passes of at most
        ``max_tokens`` padded tokens (one pass for a distillation step's short sequences). Right
        padding under a causal mask leaves every real position's logits as they are alone."""
        return prompt_scoring.prompt_logprobs_batch(
            self.model, self.device, self.weights_lock, prompts, max_tokens
        )

    def prompt_topk_batch(
        self, prompts: list[list[int]], k: int, max_tokens: int = 8192
    ) -> list[list[dict[int, tuple[float, int]] | None]]:
        """vLLM's ``prompt_logprobs: k``: per prompt position (None for the first) the ``k`` most
        likely tokens and the prompt's own token, each ``token -> (logprob, rank)`` (rank 1 =
        most likely); what a distillation teacher's top-k loss trains toward. Batched as
        ``prompt_logprobs_batch``."""
        return prompt_scoring.prompt_topk_batch(
            self.model, self.device, self.weights_lock, prompts, k, max_tokens
        )

    def decode(self, token_ids: list[int], *, skip_special_tokens: bool = False) -> str:
        # One sequence decodes to one str (transformers' annotation also covers batches).
        return cast(str, self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens))

    # worker ----------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            batch = self._requests.next_batch(self.max_batch, self.batch_window_s)
            if batch is None:
                return
            with self._swaps_done:  # a lock is not fair: let a waiting swap go first
                self._swaps_done.wait_for(lambda: not self._swaps_waiting)
            try:
                with self.weights_lock:
                    started = time.perf_counter()
                    self._generate(batch)
                    self.busy_s += time.perf_counter() - started
            except Exception as exc:  # one bad batch must not kill the server
                logger.exception("sampler batch failed")
                for p in [*batch, *self._answers.open_requests()]:  # the joiners too
                    self._answers.settle(p, error=exc)
            finally:
                self._answers.end_batch()

    @torch.inference_mode()
    def _generate(self, batch: list[Pending]) -> None:
        """Decode ``batch`` (and whoever joins it); each request's future is set when it ends."""
        batch = self._answer_unstarted(batch)
        if not batch:
            return
        self.batches_run += 1
        self._refresh_fast()
        BatchDecode(self, self._answers, self._requests, self.weight_version).run(batch)

    def _refresh_fast(self) -> None:
        """The fast decode step for the current weights (built once per weight version)."""
        if not self.fast_decode or self._fast_version == self.weight_version:
            return
        first = self._fast_version < 0
        self._fast_version = self.weight_version
        self.fast = None  # the old version's packed weights go before the new ones are built
        try:
            self.fast, reason = FastDecoder.build(self.model, self.device, self.max_batch)
        except (RuntimeError, TypeError, ValueError) as exc:  # a kernel this torch build lacks
            # An optimisation that cannot start must not stop sampling: the same tokens come from
            # transformers' forward, said once with the switch that skips the attempt.
            self.fast, self.fast_decode = None, False
            logger.warning(
                "local sampler: its fast decode step could not be built (%s: %s); decode steps run "
                "through transformers' forward (backend.options.sampler_fast_decode=false skips it)",
                type(exc).__name__,
                exc,
            )
            return
        if reason and first:
            logger.info("local sampler: decode steps through transformers' forward (%s)", reason)

    def take_joiners(self, room: int) -> list[Pending]:
        """Queued text requests that join the running batch in ``room`` more rows (its decode
        asks at each step); those aborted before they started are answered instead."""
        return self._answer_unstarted(self._requests.joiners(room, lambda: self._swaps_waiting))

    def _answer_unstarted(self, pending: list[Pending]) -> list[Pending]:
        """``pending`` less the requests aborted before they started, answered with no tokens."""
        keep: list[Pending] = []
        for p in pending:
            if not self._requests.aborted(p):
                keep.append(p)
                continue
            self._answers.settle(
                p,
                [GeneratedSequence([], [], [], "", "abort", self.weight_version) for _ in range(p.request.n)],
            )
        if len(keep) < len(pending):
            self._answers.flush()
        return keep
