"""One batch of the local sampler, from its prefill to its last token (``BatchDecode``).

The batch's prompts are prefilled together (``prefill.py``: a prompt shared by several rows
once; distinct prompts' common beginning once, then their endings, through the fast step's
native kernels where it has them: ``fast_decode.py``); then each decode step samples one token
per running row (``sampling.py``), records it, ends the rows that stop (their requests are
answered as soon as all of their rows have ended: ``answering.py``) and drops them from the batch
and the KV cache, lets queued text requests join (``joining.py``) and runs the next forward pass.
The batch ends when its last row does.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from rllm.backends.tinker.local.answering import Answers
from rllm.backends.tinker.local.fast_decode import FastDecoder
from rllm.backends.tinker.local.generation_types import Pending, Row, has_pixels
from rllm.backends.tinker.local.joining import (
    can_extend,
    extend_cache,
    fuse_join,
    joined_step,
    left_pad,
    merge_cache,
)
from rllm.backends.tinker.local.prefill import (
    left_padded,
    prefill_prompts,
    shared_prefix,
    unique_prompts,
    vision_inputs,
)
from rllm.backends.tinker.local.sampling import GREEDY_TEMPERATURE, RowSampling, SampledTokens, sample_next
from rllm.backends.tinker.local.scheduling import RequestQueue


class DecodeHost(Protocol):
    """What a batch reads from its engine (the ``SamplerEngine``) and counts on it."""

    model: torch.nn.Module
    fast: FastDecoder | None  # the model's own decode step where there is one (fast_decode.py)
    device: torch.device
    max_batch: int
    pad_id: int
    eos_ids: set[int]
    # observability, advanced as the batch runs
    forward_passes: int
    rows_shared: int
    rows_prefix_shared: int
    fast_prefills: int
    rows_joined: int
    max_batch_seen: int

    def decode(self, token_ids: list[int], *, skip_special_tokens: bool = False) -> str: ...

    def take_joiners(self, room: int) -> list[Pending]:
        """Queued requests that may join the running batch in ``room`` more rows."""
        ...


class BatchDecode:
    """The running batch: its rows, the positions still decoding, and the model's state for them
    (KV cache, attention mask, positions, last logits). Runs on the engine's thread."""

    def __init__(self, host: DecodeHost, answers: Answers, requests: RequestQueue, version: int) -> None:
        self.host = host
        self.answers = answers
        self.requests = requests
        self.version = version  # the weight version every sequence of the batch is sampled with
        self.rows: list[Row] = []
        self.active: list[int] = []  # row index of each batch position still decoding
        self.cache: Any = None
        self.attention = torch.empty(0)
        self.positions = torch.empty(0)  # [B, L], or M-RoPE's [3, B, L] after an image prompt
        self.logits = torch.empty(0)
        self.width_cap = 0  # joins stop once the cache is this wide

    def run(self, batch: list[Pending]) -> None:
        """Decode ``batch`` (and whoever joins it); each request is answered when it ends."""
        self.prefill([row for p in batch for row in self.open_rows(p)])
        while True:
            sampled = self.sample()
            keep = self.record(sampled)
            if self.requests.aborts or self.requests.cancels:
                keep = self.abort_rows(keep)
            self.answers.flush()  # every request that ended in this step: one wake-up per loop
            if not keep:
                return  # requests queued now start the next batch, without this one's columns
            joiners = self.joiners(len(keep))
            next_tokens = self.drop_ended(keep, sampled.tokens[:, None])
            if joiners:
                self.join(joiners, next_tokens)
            else:
                self.step(next_tokens)

    def open_rows(self, p: Pending) -> list[Row]:
        """``p``'s ``n`` rows (each seeded by its choice where the request has a seed)."""
        r = p.request
        stop_ids = set(r.stop_token_ids) | (set() if r.ignore_eos else self.host.eos_ids)
        rows: list[Row] = []
        for choice in range(r.n):
            generator = None
            if r.seed is not None and r.temperature >= GREEDY_TEMPERATURE:
                generator = torch.Generator(device=self.host.device).manual_seed(r.seed + choice)
            rows.append(Row(p, choice, RowSampling(r.temperature, r.top_p, generator), stop_ids))
        self.answers.open(p, len(rows))
        return rows

    # the steps ---------------------------------------------------------------------------------
    def prefill(self, rows: list[Row]) -> None:
        """The first forward pass, over each distinct prompt of ``rows``; then one cache row,
        mask, position and logits row per row."""
        self.rows = rows
        self.active = list(range(len(rows)))
        self.host.max_batch_seen = max(self.host.max_batch_seen, len(rows))
        prefilled = self.prefilled(rows)
        self.cache, self.attention, self.positions, self.logits = prefilled
        # Holes of fused joins widen the cache: joins stop once it is 4x the first prompts'.
        self.width_cap = 4 * self.attention.shape[1] + 64

    def prefilled(self, rows: list[Row]) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One forward pass over each distinct prompt of ``rows`` (after one over their common
        beginning, where they share one): the cache, mask, positions and last logits, one row
        per row."""
        host = self.host
        with_pixels = any(has_pixels(row.pending.request.vision) for row in rows)
        prompts, source = prefill_prompts(rows, with_pixels)
        common = 0 if with_pixels else shared_prefix(prompts)
        prefix = self.prefix_cache(prompts[0][:common], len(prompts)) if common else None
        if prefix is not None:  # each prompt's remainder, left-padded after the shared beginning
            input_ids, own = left_padded([p[common:] for p in prompts], host.pad_id, host.device)
            attention = torch.cat([own.new_ones((len(prompts), common)), own], -1)
        else:
            input_ids, attention = left_padded(prompts, host.pad_id, host.device)
        vision: dict[str, torch.Tensor] = {}
        if with_pixels:
            positions, vision = vision_inputs(host.model, host.device, rows, input_ids, attention)
        else:
            positions = (attention.cumsum(-1) - 1).clamp(min=0)
        host.forward_passes += 1
        new_positions = positions[..., attention.shape[1] - input_ids.shape[1] :]  # the new columns
        fast_logits = None
        if prefix is not None and host.fast is not None and host.fast.usable(prefix, new_positions):
            # the remainders through the fast step's kernels (None without them)
            fast_logits = host.fast.prefill(input_ids, attention, new_positions, prefix)
        cache: Any
        logits: torch.Tensor
        if fast_logits is not None:
            cache, logits = prefix, fast_logits
            host.fast_prefills += 1
        else:
            out = host.model(
                input_ids=input_ids,
                attention_mask=attention,
                position_ids=new_positions,
                past_key_values=prefix,
                use_cache=True,
                logits_to_keep=1,
                **vision,
            )
            cache, logits = out.past_key_values, out.logits[:, -1, :]
        if source is not None:  # one cache row, mask, position and logits row per sampled row
            host.rows_shared += len(rows) - len(prompts)
            index = torch.tensor(source, device=host.device)
            cache.batch_select_indices(index)
            attention, positions, logits = attention[index], positions[index], logits[index]
        return cache, attention, positions, logits

    def prefix_cache(self, prefix: list[int], rows: int) -> Any:
        """The KV cache of ``prefix`` (the distinct prompts' common beginning: prefill.py's
        ``shared_prefix``), computed once and copied to ``rows`` rows; None where the model's
        cache cannot take rows after it (sliding windows): those prompts are prefilled whole."""
        host = self.host
        host.forward_passes += 1
        ids = torch.tensor([prefix], dtype=torch.long, device=host.device)
        cache = host.model(input_ids=ids, use_cache=True, logits_to_keep=1).past_key_values
        if not can_extend(cache):
            return None
        cache.batch_repeat_interleave(rows)
        host.rows_prefix_shared += rows
        return cache

    def sample(self) -> SampledTokens:
        """One token per running row from the last logits (and the top logprobs asked for)."""
        top_k = max(self.rows[i].pending.request.top_logprobs for i in self.active)
        return sample_next(self.logits, [self.rows[i].sampling for i in self.active], top_k)

    def record(self, sampled: SampledTokens) -> list[int]:
        """Append each running row's token; end the rows that stop or reach their length. Returns
        the batch positions that go on."""
        tokens = sampled.tokens.tolist()
        logprobs = sampled.logprobs.tolist()
        tops_ids = sampled.top_ids.tolist() if sampled.top_ids is not None else None
        tops_lp = sampled.top_logprobs.tolist() if sampled.top_logprobs is not None else None
        keep: list[int] = []
        for pos, i in enumerate(self.active):
            row = self.rows[i]
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
            self.answers.finish(row, self.version)
        return keep

    def abort_rows(self, keep: list[int]) -> list[int]:
        """``keep`` less the rows of aborted requests (``abort_all``, or a caller gone), each
        ended now with its tokens so far."""
        still: list[int] = []
        for pos in keep:
            row = self.rows[self.active[pos]]
            if self.requests.aborted(row.pending):
                row.finish_reason = "abort"
                self.answers.finish(row, self.version)
            else:
                still.append(pos)
        return still

    def joiners(self, running: int) -> list[Pending]:
        """Queued requests that join at this step beside ``running`` rows: none once the cache
        is too wide, after an image prompt (M-RoPE positions) or with a cache that cannot grow."""
        if self.positions.dim() == 2 and self.attention.shape[1] < self.width_cap and can_extend(self.cache):
            return self.host.take_joiners(self.host.max_batch - running)
        return []

    def drop_ended(self, keep: list[int], next_tokens: torch.Tensor) -> torch.Tensor:
        """Drop the rows that ended from the batch and the KV cache; ``next_tokens`` [B, 1] of
        the rows that go on."""
        if len(keep) < len(self.active):
            index = torch.tensor(keep, device=self.host.device)
            self.cache.batch_select_indices(index)
            self.attention, next_tokens = self.attention[index], next_tokens[index]
            self.positions = self.positions.index_select(-2, index)  # [B, L] or M-RoPE's [3, B, L]
            self.active = [self.active[pos] for pos in keep]
        return next_tokens

    def step(self, next_tokens: torch.Tensor) -> None:
        """The next decode step of the running rows: one forward pass over their new tokens."""
        host = self.host
        rows = self.attention.shape[0]
        self.attention = torch.cat([self.attention, self.attention.new_ones((rows, 1))], dim=-1)
        # After a prompt that ends in text, every M-RoPE axis advances by one per token too.
        self.positions = self.positions[..., -1:] + 1
        host.forward_passes += 1
        if host.fast is not None and host.fast.usable(self.cache, self.positions):
            self.logits = host.fast.step(next_tokens, self.attention, self.positions, self.cache)
            return
        out = host.model(
            input_ids=next_tokens,
            attention_mask=self.attention,
            position_ids=self.positions,
            past_key_values=self.cache,
            use_cache=True,
        )
        self.cache = out.past_key_values
        self.logits = out.logits[:, -1, :]

    def join(self, joiners: list[Pending], next_tokens: torch.Tensor) -> None:
        """The next decode step of the running rows with the joiners' prefill, fused into one
        forward pass or beside it (joining.py); the batch grows by the joiners' rows."""
        host = self.host
        new_rows = [row for p in joiners for row in self.open_rows(p)]
        host.rows_joined += len(new_rows)
        prompts = [row.pending.request.prompt_ids for row in new_rows]
        running = len(self.active)
        self.active.extend(range(len(self.rows), len(self.rows) + len(new_rows)))
        self.rows.extend(new_rows)
        host.max_batch_seen = max(host.max_batch_seen, len(self.active))
        if not fuse_join(running, len(unique_prompts(new_rows)[0]), max(len(p) for p in prompts)):
            self.step(next_tokens)  # the running rows (``active`` counts the joiners already)
            cache, attention, positions, logits = self.prefilled(new_rows)
            merge_cache(self.cache, cache)
            width = max(self.attention.shape[1], attention.shape[1])
            self.attention = torch.cat([left_pad(self.attention, width), left_pad(attention, width)])
            self.positions = torch.cat([self.positions, positions[:, -1:]])
            self.logits = torch.cat([self.logits, logits])
            return
        step = joined_step(next_tokens, self.attention, self.positions[..., -1:], prompts, host.pad_id)
        extend_cache(self.cache, len(new_rows))
        host.forward_passes += 1
        out = host.model(
            input_ids=step.input_ids,
            attention_mask=step.attention,
            position_ids=step.positions,
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        self.logits, self.cache = out.logits[:, -1, :], out.past_key_values
        self.attention, self.positions = step.attention, step.positions[:, -1:]

    def _hit_stop_string(self, row: Row) -> bool:
        text = self.host.decode(row.completion_ids, skip_special_tokens=True)
        cuts = [text.find(s) for s in row.pending.request.stop if s and s in text]
        if not cuts:
            return False
        row.text_cut = min(cuts)  # the returned text ends before the stop string (like vLLM)
        return True
