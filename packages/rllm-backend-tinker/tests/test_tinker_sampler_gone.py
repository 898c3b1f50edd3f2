"""The local sampler frees what nobody waits for, and bounds what may wait.

A request whose HTTP client disconnects (or whose in-process caller is cancelled) stops decoding
at the next step and gives its place in the batch to the next request; past
``sampler_max_queued`` waiting requests, one more is refused at once with a 503 that names the
key. Every wait below is on an event the sampler's own threads set (a forward pass ran, a row
ended, a request was queued); the timeouts only keep a broken sampler from hanging the suite.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from tinker_helpers import running_sampler_engine, started_backend

from rllm.backends.tinker import TinkerBackend
from rllm.backends.tinker.local.generation import GenerationRequest, SamplerBusy, SamplerEngine

GUARD_S = 120.0  # a broken sampler fails the test instead of hanging it; nothing waits this long
LONG = 900  # tokens: far more than the test ever lets a disconnected request decode


class Watch:
    """Events from the sampler's engine thread: a forward pass ran; a row ended (its reason)."""

    def __init__(self, engine: SamplerEngine) -> None:
        self.forward = threading.Event()
        self.ended: list[tuple[str, int]] = []  # (finish_reason, tokens) per ended row
        self.row_ended = threading.Event()
        self.queued = threading.Event()
        # The input embeddings run once per forward pass, transformers' or the fast decode step.
        engine.model.get_input_embeddings().register_forward_hook(lambda *_: self.forward.set())
        answers = engine._answers  # pyright: ignore[reportPrivateUsage]
        finish = answers.finish

        def finished(row: Any, version: int) -> None:
            self.ended.append((row.finish_reason or "length", len(row.completion_ids)))
            finish(row, version)
            self.row_ended.set()

        answers.finish = finished  # type: ignore[method-assign]
        requests = engine._requests  # pyright: ignore[reportPrivateUsage]
        put_from_loop = requests.put_from_loop

        def queued(p: Any, loop: asyncio.AbstractEventLoop) -> None:
            put_from_loop(p, loop)
            self.queued.set()

        requests.put_from_loop = queued  # type: ignore[method-assign]
        self.cancels = threading.Semaphore(0)  # one release per request whose caller went away
        cancel = requests.cancel

        def cancelled(p: Any) -> None:
            cancel(p)
            self.cancels.release()

        requests.cancel = cancelled  # type: ignore[method-assign]


@pytest.fixture
def one_place(tiny_model_path: Path) -> Iterator[TinkerBackend]:
    """A sampler with room for one decoding sequence and one waiting request."""
    backend = started_backend(tiny_model_path, sampler_max_batch=1, sampler_max_queued=1)
    yield backend
    asyncio.run(backend.close())


def _raw_request(url: str, body: dict[str, Any]) -> socket.socket:
    """POST ``body`` on a socket of its own, not reading the answer (the caller may hang up)."""
    parts = urlsplit(url)
    payload = json.dumps(body).encode()
    sock = socket.create_connection((parts.hostname, parts.port))
    head = (
        f"POST {parts.path}/completions HTTP/1.1\r\nHost: {parts.netloc}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    sock.sendall(head.encode() + payload)
    return sock


def _post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        f"{url}/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=GUARD_S) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _long(prompt: str = "say : apple") -> dict[str, Any]:
    return {"model": "m", "prompt": prompt, "max_tokens": LONG, "ignore_eos": True}


def test_a_disconnected_client_stops_decoding_and_frees_its_place(one_place: TinkerBackend) -> None:
    engine = one_place.service.engine
    watch = Watch(engine)
    url = one_place.inference_urls()[0]
    gone = _raw_request(url, _long())
    assert watch.forward.wait(GUARD_S), "the request never started decoding"
    gone.close()  # the client goes away mid-decode
    assert watch.row_ended.wait(GUARD_S), "the disconnected request's row never ended"
    ((reason, tokens),) = watch.ended
    assert reason == "abort" and tokens < LONG
    # Its place is free: a request that needs the batch's one place runs to its end.
    status, body = _post(url, {"model": "m", "prompt": "say : plum", "max_tokens": 3, "ignore_eos": True})
    assert status == 200, body
    assert body["choices"][0]["finish_reason"] == "length"
    assert watch.ended[-1] == ("length", 3)


def test_a_cancelled_in_process_call_stops_decoding(tiny_model_path: Path) -> None:
    with running_sampler_engine(tiny_model_path) as engine:
        watch = Watch(engine)
        prompt = engine.tokenizer("say : apple", add_special_tokens=False)["input_ids"]

        async def cancel_mid_decode() -> None:
            waiter = engine.submit_async(GenerationRequest(prompt, LONG, ignore_eos=True))
            await asyncio.to_thread(watch.forward.wait, GUARD_S)
            waiter.cancel()  # the gateway's call was cancelled (its rollout's deadline)
            assert await asyncio.to_thread(watch.row_ended.wait, GUARD_S)

        asyncio.run(cancel_mid_decode())
    ((reason, tokens),) = watch.ended
    assert reason == "abort" and tokens < LONG


def test_a_full_queue_refuses_one_more_request_naming_the_key(one_place: TinkerBackend) -> None:
    engine = one_place.service.engine
    watch = Watch(engine)
    url = one_place.inference_urls()[0]
    decoding = _raw_request(url, _long())
    waiting: socket.socket | None = None
    try:
        assert watch.forward.wait(GUARD_S), "the first request never started decoding"
        watch.queued.clear()
        waiting = _raw_request(url, _long("say : plum"))  # takes the one waiting place
        assert watch.queued.wait(GUARD_S), "the second request was never queued"
        status, body = _post(url, _long("say : grape"))
        assert status == 503, body
        message = body["error"]["message"]
        assert "sampler_max_queued=1" in message and "\n" not in message
        assert body["error"]["code"] == "sampler_full"
    finally:
        decoding.close()
        if waiting is not None:
            waiting.close()
    # Both callers gone: the decoding one is cut short, the waiting one never starts (it is
    # answered unstarted), and a request after them gets the batch's one place.
    for _ in range(2):
        assert watch.cancels.acquire(timeout=GUARD_S), "a disconnect was not noticed"
    status, body = _post(url, {"model": "m", "prompt": "say : plum", "max_tokens": 3, "ignore_eos": True})
    assert status == 200, body
    assert watch.ended[0][0] == "abort" and watch.ended[-1] == ("length", 3)
    assert all(tokens < LONG for _, tokens in watch.ended)


def test_the_engine_refuses_past_max_queued() -> None:
    # The bound itself, without a model: nothing decodes, so every request submitted waits.
    engine = SamplerEngine.__new__(SamplerEngine)
    from rllm.backends.tinker.local.scheduling import RequestQueue

    engine._requests = RequestQueue()  # pyright: ignore[reportPrivateUsage]
    engine.max_queued, engine.max_batch = 2, 4
    for _ in range(2):
        engine.submit(GenerationRequest([1, 2], 4))
    with pytest.raises(SamplerBusy, match=r"^local sampler is full: 2 requests already wait .*max_queued=2"):
        engine.submit(GenerationRequest([1, 2], 4))
