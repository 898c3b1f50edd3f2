"""What the local sampler (``generation.SamplerEngine``) takes and gives, and its own records of
them: a queued request (``Pending``) and one of its sequences while it decodes (``Row``)."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from rllm.backends.tinker.local.sampling import RowSampling


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
class Pending:
    """A submitted request until it is answered."""

    request: GenerationRequest
    future: Future[list[GeneratedSequence]] | None  # submit(): answered from the engine thread
    epoch: int = 0  # abort_all calls before its submission: a later call aborts it
    # submit_async(): answered on its caller's loop, batched per decode step (outbox.py)
    waiter: asyncio.Future[list[GeneratedSequence]] | None = None
    loop: asyncio.AbstractEventLoop | None = None
    settled: bool = False  # answered or failed (only ever once)
    # Its caller went away (an HTTP client that disconnected, a cancelled in-process call):
    # it ends at the next decode step like an aborted request, freeing its rows.
    cancelled: bool = False


@dataclass
class Row:
    """One of a request's ``n`` sequences in the running batch: its tokens so far."""

    pending: Pending
    choice: int
    sampling: RowSampling
    stop_ids: set[int]
    completion_ids: list[int] = field(default_factory=list)
    completion_logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    finish_reason: str | None = None
    text_cut: int | None = None


def has_pixels(vision: Any) -> bool:
    """A request with image inputs (a vision prompt without images decodes as text)."""
    return vision is not None and vision.pixel_values is not None
