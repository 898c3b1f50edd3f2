"""Answering the local sampler's requests: a request's sequences are collected as its rows end,
and it is answered, once, when the last one does (the others of its batch decode on).

A caller on an event loop gets its answer at the next :meth:`Answers.flush` (the end of the
decode step, with every other request of its loop that ended in it: ``outbox.py``); a caller of
``submit`` gets it at once through its ``concurrent.futures.Future``. Used by the engine's
thread only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError

from rllm.backends.tinker.local.generation_types import GeneratedSequence, Pending, Row
from rllm.backends.tinker.local.outbox import Outbox

# Decoded completions remembered: those of at most this many tokens, this many at most (the dict
# is emptied when full).
TEXT_CACHE_MAX_TOKENS = 64
TEXT_CACHE_ENTRIES = 4096


class Answers:
    """The running batch's requests, their sequences so far, and the answers on their way."""

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self._decode = decode  # token ids -> text, special tokens skipped
        self._outbox = Outbox()
        self.texts: dict[tuple[int, ...], str] = {}  # decoded short completions
        self._open: dict[Pending, int] = {}  # the running batch's requests: rows still decoding
        self._done: dict[Pending, list[tuple[int, GeneratedSequence]]] = {}

    def open(self, p: Pending, rows: int) -> None:
        """``p`` starts decoding as ``rows`` rows."""
        self._open[p] = rows
        self._done[p] = []

    def open_requests(self) -> list[Pending]:
        """The requests of the running batch not yet answered (joiners included)."""
        return list(self._open)

    def finish(self, row: Row, version: int) -> None:
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
            weight_version=version,
        )
        self._done[p].append((row.choice, seq))
        self._open[p] -= 1
        if self._open[p] == 0:
            del self._open[p]
            answers = sorted(self._done.pop(p), key=lambda a: a[0])  # rows end in any order
            self.settle(p, [seq for _, seq in answers])

    def settle(
        self,
        p: Pending,
        value: list[GeneratedSequence] | None = None,
        error: BaseException | None = None,
    ) -> None:
        """Answer ``p`` (or fail it with ``error``) once. A loop's waiter is answered at the next
        :meth:`flush`: the end of the decode step (or of the batch)."""
        if p.settled:
            return
        p.settled = True
        if p.waiter is not None and p.loop is not None:
            self._outbox.put(p.loop, p.waiter, value, error)
        elif p.future is not None:
            _deliver(p.future, value, error)

    def flush(self) -> None:
        """Hand every answer settled since the last flush to its caller's loop."""
        self._outbox.flush()

    def end_batch(self) -> None:
        """After a batch (ended or failed): its answers go out, its records are dropped."""
        self._outbox.flush()
        self._open.clear()
        self._done.clear()

    def _completion_text(self, ids: list[int]) -> str:
        """A completion's text, remembered for short ones: an RL group samples the same few
        short completions again and again (decoding is a pure function of the ids)."""
        if len(ids) > TEXT_CACHE_MAX_TOKENS:
            return self._decode(ids)
        key = tuple(ids)
        text = self.texts.get(key)
        if text is None:
            if len(self.texts) >= TEXT_CACHE_ENTRIES:
                self.texts.clear()
            text = self.texts[key] = self._decode(ids)
        return text


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
