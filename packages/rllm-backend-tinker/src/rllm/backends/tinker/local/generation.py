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
with the version that sampled it, so a weight swap need not wait for long completions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch

from rllm.backends.tinker.local.joining import can_extend, extend_cache, joined_step
from rllm.backends.tinker.local.outbox import Outbox
from rllm.backends.tinker.local.sampling import GREEDY_TEMPERATURE, RowSampling, sample_next
from rllm.types.errors import StateError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

# Decoded completions remembered by the engine: those of at most this many tokens, this many at
# most (the dict is emptied when full).
_TEXT_CACHE_MAX_TOKENS = 64
_TEXT_CACHE_ENTRIES = 4096


@dataclass
class GenerationRequest:
    """One prompt to complete ``n`` times. Validated by the HTTP layer before it gets here."""

    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    top_logprobs: int = 0
    # Images of a vision-language prompt (vlm_prompt.VlmInputs: pixel patches, grids, image-token
    # mask); prompt_ids then hold each image's placeholder tokens.
    vision: Any = None


@dataclass
class GeneratedSequence:
    completion_ids: list[int]
    completion_logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]]  # per generated token; empty lists unless requested
    text: str
    finish_reason: str  # "stop" | "length" | "abort" (abort_all ended it; the tokens so far)
    weight_version: int


@dataclass(eq=False)  # identity-hashed: used as a dict key
class _Pending:
    request: GenerationRequest
    future: Future[list[GeneratedSequence]] | None  # submit(): answered from the engine thread
    epoch: int = 0  # abort_all calls before its submission: a later call aborts it
    # submit_async(): answered on its caller's loop, batched per decode step (outbox.py)
    waiter: asyncio.Future[list[GeneratedSequence]] | None = None
    loop: asyncio.AbstractEventLoop | None = None
    settled: bool = False  # answered or failed (only ever once)


@dataclass
class _Row:
    pending: _Pending
    choice: int
    sampling: RowSampling
    stop_ids: set[int]
    completion_ids: list[int] = field(default_factory=list)
    completion_logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    finish_reason: str | None = None
    text_cut: int | None = None


class _RopeIndexOwner(Protocol):
    """The submodule of a vision-language model that computes its M-RoPE positions."""

    def get_rope_index(
        self,
        input_ids: torch.Tensor,
        mm_token_type_ids: torch.Tensor,
        image_grid_thw: torch.Tensor | None = None,
        video_grid_thw: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


class SamplerEngine:
    """Owns the sampling model; thread-safe ``submit`` returns a concurrent Future."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        device: torch.device,
        max_batch: int,
        batch_window_s: float = 0.001,
    ) -> None:
        self.model = model
        self.batch_window_s = batch_window_s
        self._outbox = Outbox()
        # submit_async's requests of each caller loop's current iteration, handed to the queue
        # together when that iteration ends (each list is touched only by its loop's thread).
        self._loop_buffers: dict[asyncio.AbstractEventLoop, list[_Pending]] = {}
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
        self._texts: dict[tuple[int, ...], str] = {}  # decoded short completions (engine thread only)
        self._open: dict[_Pending, int] = {}  # the running batch's requests: rows still decoding
        self._answers: dict[_Pending, list[tuple[int, GeneratedSequence]]] = {}
        self._batch_version = 0
        self._swaps_waiting = 0  # weight swaps / pauses waiting for the lock: no joins meanwhile
        self._swaps_done = threading.Condition()
        self._queue: queue.Queue[_Pending | None] = queue.Queue()
        self._carry: list[_Pending] = []
        self._aborts = 0  # abort_all calls so far; the worker reads it at each decode step
        self._abort_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopping = False
        eos = getattr(tokenizer, "eos_token_id", None)
        self._eos_ids = {eos} if isinstance(eos, int) else set(eos or [])
        pad = getattr(tokenizer, "pad_token_id", None)
        self._pad_id: int = pad if pad is not None else next(iter(self._eos_ids), 0)
        config = getattr(model, "config", None)
        self.max_positions: int = int(getattr(config, "max_position_embeddings", 1 << 30) or (1 << 30))

    # lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="rllm-sampler-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout=30)
        # Requests still waiting would otherwise hang their HTTP clients forever.
        leftovers = list(self._carry)
        self._carry.clear()
        while not self._queue.empty():
            item = self._queue.get_nowait()
            if item is not None:
                leftovers.append(item)
        for p in leftovers:
            self._settle(p, error=StateError("sampler engine stopped before this request ran"))
        self._outbox.flush()

    def submit(self, request: GenerationRequest) -> Future[list[GeneratedSequence]]:
        """Queue ``request``; the future (settled from the engine's thread) gets its sequences."""
        future: Future[list[GeneratedSequence]] = Future()
        if self._stopping:
            future.set_exception(StateError("sampler engine is stopped"))
            return future
        self._queue.put(_Pending(request, future, self._aborts))
        return future

    def submit_async(self, request: GenerationRequest) -> asyncio.Future[list[GeneratedSequence]]:
        """``submit`` for a caller on a running event loop: the returned future is settled on
        that loop, together with every other request of the loop that ended in the same decode
        step (one wake-up of the loop per step, not one per request). Cancelling it only drops
        the answer.

        The requests a loop submits in one iteration reach the engine together when that
        iteration ends: a gateway in this process runs a step's flows side by side on one loop
        and submits their calls one by one as it gets to each (milliseconds apart on a busy
        CPU); handed over together they start one batch, instead of a batch with the first
        and a forward pass more for each later one joining it."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[list[GeneratedSequence]] = loop.create_future()
        if self._stopping:
            waiter.set_exception(StateError("sampler engine is stopped"))
            return waiter
        pending = _Pending(request, None, self._aborts, waiter, loop)
        buffer = self._loop_buffers.get(loop)
        if buffer is None:
            buffer = self._loop_buffers[loop] = []
            loop.call_soon(self._hand_over, loop)  # runs after this iteration's callbacks
        buffer.append(pending)
        return waiter

    def _hand_over(self, loop: asyncio.AbstractEventLoop) -> None:
        """On ``loop``: its buffered requests go to the engine's queue."""
        for p in self._loop_buffers.pop(loop, []):
            if not self._stopping:
                self._queue.put(p)
            elif p.waiter is not None and not p.waiter.done():  # nobody else would answer it
                p.settled = True
                p.waiter.set_exception(StateError("sampler engine stopped before this request ran"))

    def _settle(
        self,
        p: _Pending,
        value: list[GeneratedSequence] | None = None,
        error: BaseException | None = None,
    ) -> None:
        """Answer ``p`` (or fail it with ``error``) once. A loop's waiter is answered at the next
        ``self._outbox.flush()``: the end of the decode step (or of the batch)."""
        if p.settled:
            return
        p.settled = True
        if p.waiter is not None and p.loop is not None:
            self._outbox.put(p.loop, p.waiter, value, error)
        elif p.future is not None:
            _deliver(p.future, value, error)

    def abort_all(self) -> None:
        """End every request submitted before now at its next decode step (or at once, if it
        has not started) with ``finish_reason = "abort"`` and the tokens sampled so far; requests
        submitted later are not touched. A partial rollout's gateway calls this at a weight sync
        and re-sends each call's token history as a continuation on the new weights."""
        with self._abort_lock:
            self._aborts += 1

    def _aborted(self, p: _Pending) -> bool:
        return p.epoch < self._aborts

    def _answer_unstarted(self, pending: list[_Pending]) -> list[_Pending]:
        """``pending`` less the requests aborted before they started, answered with no tokens."""
        keep: list[_Pending] = []
        for p in pending:
            if not self._aborted(p):
                keep.append(p)
                continue
            self._settle(
                p,
                [GeneratedSequence([], [], [], "", "abort", self.weight_version) for _ in range(p.request.n)],
            )
        if len(keep) < len(pending):
            self._outbox.flush()
        return keep

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
        out: list[list[float | None]] = []
        for chunk, width in _padded_chunks(prompts, max_tokens):
            with self.weights_lock, torch.no_grad():
                ids, logprobs = self._prompt_log_softmax(chunk, width)
                rows = logprobs.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1).tolist()
            out.extend([None, *(float(x) for x in rows[r][: len(p) - 1])] for r, p in enumerate(chunk))
        return out

    def prompt_topk_batch(
        self, prompts: list[list[int]], k: int, max_tokens: int = 8192
    ) -> list[list[dict[int, tuple[float, int]] | None]]:
        """vLLM's ``prompt_logprobs: k``: per prompt position (None for the first) the ``k`` most
        likely tokens and the prompt's own token, each ``token -> (logprob, rank)`` (rank 1 =
        most likely); what a distillation teacher's top-k loss trains toward. Batched as
        ``prompt_logprobs_batch``."""
        out: list[list[dict[int, tuple[float, int]] | None]] = []
        for chunk, width in _padded_chunks(prompts, max_tokens):
            with self.weights_lock, torch.no_grad():
                ids, logprobs = self._prompt_log_softmax(chunk, width)
                actual = logprobs.gather(-1, ids[:, 1:].unsqueeze(-1))
                ranks = (logprobs > actual).sum(-1) + 1  # vLLM's rank of the prompt's own token
                top_values, top_ids = logprobs.topk(k, dim=-1)
                rows = (actual.squeeze(-1).tolist(), ranks.tolist(), top_values.tolist(), top_ids.tolist())
            for r, p in enumerate(chunk):
                scored: list[dict[int, tuple[float, int]] | None] = [None]
                for j in range(len(p) - 1):
                    entry = {
                        int(t): (float(v), n + 1)
                        for n, (t, v) in enumerate(zip(rows[3][r][j], rows[2][r][j], strict=True))
                    }
                    entry.setdefault(p[j + 1], (float(rows[0][r][j]), int(rows[1][r][j])))
                    scored.append(entry)
                out.append(scored)
        return out

    def _prompt_log_softmax(self, prompts: list[list[int]], width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-padded ids [B, width] and the log-softmax predicting each next token [B, width-1, V]
        (call under the weights lock and no_grad)."""
        ids = torch.zeros((len(prompts), width), dtype=torch.long, device=self.device)
        mask = torch.zeros((len(prompts), width), dtype=torch.long, device=self.device)
        for row, p in enumerate(prompts):
            ids[row, : len(p)] = torch.tensor(p, dtype=torch.long)
            mask[row, : len(p)] = 1
        logits = self.model(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, :-1].float()
        return ids, torch.log_softmax(logits, dim=-1)

    def decode(self, token_ids: list[int], *, skip_special_tokens: bool = False) -> str:
        # One sequence decodes to one str (transformers' annotation also covers batches).
        return cast(str, self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens))

    # worker ----------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            batch = self._next_batch()
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
                for p in [*batch, *self._open]:  # the joiners too
                    self._settle(p, error=exc)
            finally:
                self._outbox.flush()
                self._open.clear()
                self._answers.clear()

    def _next_batch(self) -> list[_Pending] | None:
        """Everything queued now, up to max_batch sequences; blocks only while nothing waits.

        Once a request is in hand, requests keep being collected while they arrive less than
        ``batch_window_s`` apart: concurrent clients (a group of rollouts) rarely hit the queue
        at the same instant, and one batch of 32 rows costs about what a batch of 8 does.
        """
        batch: list[_Pending] = []
        rows = 0
        if not self._carry:
            first = self._queue.get()
            if first is None:
                return None
            self._carry.append(first)
        while True:
            while self._carry:
                p = self._carry[0]
                if batch and rows + p.request.n > self.max_batch:
                    return batch
                batch.append(self._carry.pop(0))
                rows += p.request.n
            try:
                item = (
                    self._queue.get(timeout=self.batch_window_s)
                    if self.batch_window_s > 0
                    else self._queue.get_nowait()
                )
            except queue.Empty:
                return batch
            if item is None:
                self._queue.put(None)  # stop after this batch
                return batch
            self._carry.append(item)

    @torch.inference_mode()
    def _generate(self, batch: list[_Pending]) -> None:
        """Decode ``batch`` (and whoever joins it); each request's future is set when it ends."""
        batch = self._answer_unstarted(batch)
        if not batch:
            return
        self.batches_run += 1
        self._batch_version = self.weight_version
        self._decode([row for p in batch for row in self._open_rows(p)])

    def _open_rows(self, p: _Pending) -> list[_Row]:
        r = p.request
        stop_ids = set(r.stop_token_ids) | (set() if r.ignore_eos else self._eos_ids)
        rows: list[_Row] = []
        for choice in range(r.n):
            generator = None
            if r.seed is not None and r.temperature >= GREEDY_TEMPERATURE:
                generator = torch.Generator(device=self.device).manual_seed(r.seed + choice)
            rows.append(_Row(p, choice, RowSampling(r.temperature, r.top_p, generator), stop_ids))
        self._open[p] = len(rows)
        self._answers[p] = []
        return rows

    def _completion_text(self, ids: list[int]) -> str:
        """A completion's text, remembered for short ones: an RL group samples the same few
        short completions again and again (decoding is a pure function of the ids)."""
        if len(ids) > _TEXT_CACHE_MAX_TOKENS:
            return self.decode(ids, skip_special_tokens=True)
        key = tuple(ids)
        text = self._texts.get(key)
        if text is None:
            if len(self._texts) >= _TEXT_CACHE_ENTRIES:
                self._texts.clear()
            text = self._texts[key] = self.decode(ids, skip_special_tokens=True)
        return text

    def _finish_row(self, row: _Row) -> None:
        """Record an ended row; answer its request once all of its rows have ended."""
        text = self._completion_text(row.completion_ids)
        if row.text_cut is not None:
            text = text[: row.text_cut]
        p = row.pending
        seq = GeneratedSequence(
            completion_ids=row.completion_ids,
            completion_logprobs=row.completion_logprobs,
            top_logprobs=row.top,
            text=text,
            finish_reason=row.finish_reason or "length",
            weight_version=self._batch_version,
        )
        self._answers[p].append((row.choice, seq))
        self._open[p] -= 1
        if self._open[p] == 0:
            del self._open[p]
            answers = sorted(self._answers.pop(p), key=lambda a: a[0])  # rows end in any order
            self._settle(p, [seq for _, seq in answers])

    def _joiners(self, room: int) -> list[_Pending]:
        """Queued text requests that fit in ``room`` more rows, in arrival order; none while a
        weight swap waits (it would otherwise wait for the joiners too)."""
        joiners: list[_Pending] = []
        while not self._swaps_waiting:
            if not self._carry:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._queue.put(None)  # stop after this batch
                    break
                self._carry.append(item)
            p = self._carry[0]
            if p.request.n > room or _has_pixels(p.request.vision):
                break  # it starts the next batch (order is kept)
            joiners.append(self._carry.pop(0))
            room -= p.request.n
        return joiners

    def _decode(self, rows: list[_Row]) -> None:
        device = self.device
        has_pixels = any(_has_pixels(row.pending.request.vision) for row in rows)
        # Rows with the same text prompt (a request's n choices, a group's n=1 calls) are prefilled
        # once and the prompt's cache row, mask, positions and logits copied to each: the same
        # tokens and logprobs up to float rounding (a matmul over fewer rows may round otherwise,
        # as for a joined row), for 1/n of the prefill.
        prompts, source = _unique_prompts(rows) if not has_pixels else _all_prompts(rows)
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self._pad_id, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, prompt in enumerate(prompts):
            input_ids[i, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            attention[i, width - len(prompt) :] = 1
        input_ids, attention = input_ids.to(device), attention.to(device)
        vision: dict[str, torch.Tensor] = {}
        if has_pixels:
            positions, vision = self._vision_inputs(rows, input_ids, attention)
        else:
            positions = (attention.cumsum(-1) - 1).clamp(min=0)
        active = list(range(len(rows)))  # row index of each batch position still decoding
        self.max_batch_seen = max(self.max_batch_seen, len(rows))
        # Holes of joined steps widen the cache: joins stop once it is 4x the first prompts'.
        width_cap = 4 * width + 64
        self.forward_passes += 1
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **vision,
        )
        cache = out.past_key_values
        logits = out.logits[:, -1, :]
        if source is not None:  # one cache row, mask, position and logits row per sampled row
            self.rows_shared += len(rows) - len(prompts)
            index = torch.tensor(source, device=device)
            cache.batch_select_indices(index)
            attention, positions, logits = attention[index], positions[index], logits[index]
        while True:
            top_k = max(rows[i].pending.request.top_logprobs for i in active)
            sampled = sample_next(logits, [rows[i].sampling for i in active], top_k)
            tokens = sampled.tokens.tolist()
            logprobs = sampled.logprobs.tolist()
            tops_ids = sampled.top_ids.tolist() if sampled.top_ids is not None else None
            tops_lp = sampled.top_logprobs.tolist() if sampled.top_logprobs is not None else None
            keep: list[int] = []
            for pos, i in enumerate(active):
                row = rows[i]
                request = row.pending.request
                row.completion_ids.append(tokens[pos])
                row.completion_logprobs.append(logprobs[pos])
                k = request.top_logprobs
                row.top.append(
                    list(zip(tops_ids[pos][:k], tops_lp[pos][:k], strict=True))
                    if k and tops_ids and tops_lp
                    else []
                )
                if tokens[pos] in row.stop_ids or (request.stop and self._hit_stop_string(row)):
                    row.finish_reason = "stop"
                elif len(row.completion_ids) >= request.max_tokens:
                    row.finish_reason = "length"
                else:
                    keep.append(pos)
                    continue
                self._finish_row(row)
            if self._aborts:
                keep = self._abort_rows(rows, active, keep)
            self._outbox.flush()  # every request that ended in this step: one wake-up per loop
            if not keep:
                return  # requests queued now start the next batch, without this one's columns
            joiners: list[_Pending] = []
            if positions.dim() == 2 and attention.shape[1] < width_cap and can_extend(cache):
                joiners = self._answer_unstarted(self._joiners(self.max_batch - len(keep)))
            next_tokens = sampled.tokens[:, None]
            if len(keep) < len(active):  # drop finished rows from the batch and the KV cache
                index = torch.tensor(keep, device=device)
                cache.batch_select_indices(index)
                attention, next_tokens = attention[index], next_tokens[index]
                positions = positions.index_select(-2, index)  # [B, L] or M-RoPE's [3, B, L]
                active = [active[pos] for pos in keep]
            if joiners:
                logits, cache, attention, positions = self._join(
                    rows, active, joiners, next_tokens, attention, positions[..., -1:], cache
                )
                continue
            attention = torch.cat([attention, attention.new_ones((len(active), 1))], dim=-1)
            # After a prompt that ends in text, every M-RoPE axis advances by one per token too.
            positions = positions[..., -1:] + 1
            self.forward_passes += 1
            out = self.model(
                input_ids=next_tokens,
                attention_mask=attention,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
            )
            cache = out.past_key_values
            logits = out.logits[:, -1, :]

    def _abort_rows(self, rows: list[_Row], active: list[int], keep: list[int]) -> list[int]:
        """``keep`` less the rows of aborted requests, each ended now with its tokens so far."""
        still: list[int] = []
        for pos in keep:
            row = rows[active[pos]]
            if self._aborted(row.pending):
                row.finish_reason = "abort"
                self._finish_row(row)
            else:
                still.append(pos)
        return still

    def _join(
        self,
        rows: list[_Row],
        active: list[int],
        joiners: list[_Pending],
        next_tokens: torch.Tensor,
        attention: torch.Tensor,
        last_positions: torch.Tensor,
        cache: Any,
    ) -> tuple[torch.Tensor, Any, torch.Tensor, torch.Tensor]:
        """The next decode step of the running rows fused with the joiners' prefill (joining.py);
        ``rows`` and ``active`` grow by the joiners' rows."""
        new_rows = [row for p in joiners for row in self._open_rows(p)]
        self.rows_joined += len(new_rows)
        step = joined_step(
            next_tokens,
            attention,
            last_positions,
            [row.pending.request.prompt_ids for row in new_rows],
            self._pad_id,
        )
        extend_cache(cache, len(new_rows))
        active.extend(range(len(rows), len(rows) + len(new_rows)))
        rows.extend(new_rows)
        self.max_batch_seen = max(self.max_batch_seen, len(active))
        self.forward_passes += 1
        out = self.model(
            input_ids=step.input_ids,
            attention_mask=step.attention,
            position_ids=step.positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1, :], out.past_key_values, step.attention, step.positions[:, -1:]

    def _vision_inputs(
        self, rows: list[_Row], input_ids: torch.Tensor, attention: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """M-RoPE positions ([3, B, L], from the model's own get_rope_index over the left-padded
        batch) and the prefill's image inputs: every row's pixel patches and grids in row order."""
        width = input_ids.shape[1]
        mm = torch.zeros_like(input_ids)
        pixels, grids = [], []
        for i, row in enumerate(rows):
            v = row.pending.request.vision
            if v is None or v.pixel_values is None:
                continue
            mm[i, width - len(v.mm_token_type_ids) :] = torch.tensor(v.mm_token_type_ids)
            pixels.append(v.pixel_values)
            grids.append(v.image_grid_thw)
        grid = torch.cat(grids).to(self.device)
        # hasattr does not narrow an nn.Module (its __getattr__ types every attribute).
        rope_owner = cast(
            _RopeIndexOwner, next(m for m in self.model.modules() if hasattr(m, "get_rope_index"))
        )
        positions, _ = rope_owner.get_rope_index(
            input_ids, mm_token_type_ids=mm, image_grid_thw=grid, attention_mask=attention
        )
        dtype = next(self.model.parameters()).dtype
        inputs = {
            "pixel_values": torch.cat(pixels).to(self.device, dtype),
            "image_grid_thw": grid,
            "mm_token_type_ids": mm,
        }
        return positions, inputs

    def _hit_stop_string(self, row: _Row) -> bool:
        text = self.decode(row.completion_ids, skip_special_tokens=True)
        cuts = [text.find(s) for s in row.pending.request.stop if s and s in text]
        if not cuts:
            return False
        row.text_cut = min(cuts)  # the returned text ends before the stop string (like vLLM)
        return True


def _deliver(
    future: Future[list[GeneratedSequence]],
    value: list[GeneratedSequence] | None,
    error: BaseException | None,
) -> None:
    """Answer a request unless its caller gave up on it meanwhile (an HTTP client that went away:
    ``asyncio.wrap_future`` cancels the future). Raising there would fail the whole batch, every
    other caller's request with it."""
    with contextlib.suppress(InvalidStateError):
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value if value is not None else [])


def _unique_prompts(rows: list[_Row]) -> tuple[list[list[int]], list[int] | None]:
    """The distinct prompts of ``rows`` in first-seen order, and each row's index into them
    (None when every prompt is distinct: nothing to share)."""
    index: dict[tuple[int, ...], int] = {}
    prompts: list[list[int]] = []
    source: list[int] = []
    for row in rows:
        prompt = row.pending.request.prompt_ids
        at = index.setdefault(tuple(prompt), len(prompts))
        if at == len(prompts):
            prompts.append(prompt)
        source.append(at)
    return prompts, (source if len(prompts) < len(rows) else None)


def _all_prompts(rows: list[_Row]) -> tuple[list[list[int]], None]:
    """Every row's prompt, unshared (image rows: their pixels go in by row)."""
    return [row.pending.request.prompt_ids for row in rows], None


def _has_pixels(vision: Any) -> bool:
    """A request with image inputs (a vision prompt without images decodes as text)."""
    return vision is not None and vision.pixel_values is not None


def _padded_chunks(prompts: list[list[int]], max_tokens: int) -> Iterator[tuple[list[list[int]], int]]:
    """Consecutive prompts grouped so each group's padded size (rows x longest) stays within
    ``max_tokens`` (a longer prompt goes alone); each with its width. Right padding under a
    causal mask leaves every real position's logits as they are alone."""
    start = 0
    while start < len(prompts):
        end, width = start, 0
        while end < len(prompts) and (
            end == start or max(width, len(prompts[end])) * (end - start + 1) <= max_tokens
        ):
            width = max(width, len(prompts[end]))
            end += 1
        yield prompts[start:end], width
        start = end
