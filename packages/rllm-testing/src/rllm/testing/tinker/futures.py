"""The futures of the FAKE Tinker service (see :mod:`.server`): a training call answers at once
with a ``request_id``; the calls of one model run in ``seq_id`` order, as the service runs them;
``retrieve_future`` polls for the result (``try_again`` until it is there)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

from aiohttp import web

from rllm.testing.service import ContractError
from rllm.testing.tinker.training import FakeFuture, TinkerModel


def future_json(future: FakeFuture) -> web.Response:
    """What a training call answers at once: the future to poll."""
    return web.json_response({"request_id": future.request_id, "model_id": future.model_id})


class FakeFutures:
    """Every future the fake service made, by request_id.

    ``ids`` numbers the futures (shared with the service's other ids); ``violations`` is the
    service's list, where a call that fails while it runs is kept too. A future is answered
    ``try_again`` for its first ``try_again_polls`` polls, so the SDK's polling path runs; one
    whose model never got an earlier seq_id fails after ``seq_gap_timeout_s``.
    """

    def __init__(
        self, ids: Iterator[int], violations: list[str], try_again_polls: int, seq_gap_timeout_s: float
    ) -> None:
        self.try_again_polls = try_again_polls
        self.seq_gap_timeout_s = seq_gap_timeout_s
        self._ids = ids
        self._violations = violations
        self._futures: dict[str, FakeFuture] = {}

    def new(self, model_id: str | None) -> FakeFuture:
        future = FakeFuture(request_id=f"req-{next(self._ids)}", model_id=model_id)
        self._futures[future.request_id] = future
        return future

    def enqueue(self, model: TinkerModel, seq_id: Any, op: Callable[[], Any]) -> FakeFuture:
        """Run ``op`` when every earlier seq_id of this model has run (the service's ordering)."""
        if not isinstance(seq_id, int) or seq_id < model.next_seq or seq_id in model.pending:
            raise ContractError(f"seq_id {seq_id!r} is stale or repeated (next is {model.next_seq})")
        future = self.new(model.model_id)
        model.pending[seq_id] = (op, future)
        while model.next_seq in model.pending:
            seq = model.next_seq
            run, fut = model.pending.pop(seq)
            model.seq_ids.append(seq)
            model.next_seq += 1
            try:
                fut.result = run()
            except ContractError as exc:  # a user error found while running: a failed future
                self._violations.append(f"seq {seq}: {exc}")
                fut.error = str(exc)
            fut.done.set()
        return future

    async def retrieve(self, body: dict[str, Any], accept: str) -> web.Response:
        """The answer to ``retrieve_future`` (``body`` its JSON, ``accept`` its Accept header)."""
        future = self._futures.get(str(body.get("request_id")))
        if future is None:
            raise ContractError(f"retrieve_future of unknown request_id {body.get('request_id')!r}")
        if future.polls < self.try_again_polls or not future.done.is_set():
            future.polls += 1
            with_timeout = asyncio.wait_for(future.done.wait(), 0.5)
            try:
                await with_timeout
            except TimeoutError:
                if time.monotonic() - future.created > self.seq_gap_timeout_s:
                    future.error = "never ran: an earlier seq_id of this model never arrived"
                    future.done.set()
            if future.polls <= self.try_again_polls or not future.done.is_set():
                return web.json_response(
                    {"type": "try_again", "request_id": future.request_id, "queue_state": "active"}
                )
        if future.error is not None:
            return web.json_response({"error": future.error, "category": "user"})
        if isinstance(future.result, bytes):
            if "application/x-protobuf" not in accept:
                raise ContractError(
                    "a ForwardBackwardOutput was polled without Accept: application/x-protobuf"
                )
            return web.Response(body=future.result, content_type="application/x-protobuf")
        return web.json_response(future.result)
