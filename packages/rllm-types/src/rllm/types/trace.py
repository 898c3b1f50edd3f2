"""TraceRecord: what the gateway captured of one LLM call."""

from __future__ import annotations

import time
from typing import Any, Literal

import msgspec

from rllm.types.arrays import FloatArray, TokenArray, as_float_array, as_token_array
from rllm.types.episode import new_id
from rllm.types.errors import InvariantError
from rllm.types.messages import Message
from rllm.types.version import check_schema_version, current_schema_version

TraceStatus = Literal["ok", "abort", "error"]


class Usage(msgspec.Struct, omit_defaults=True):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class TraceRecord(msgspec.Struct, omit_defaults=True, repr_omit_defaults=True):
    """One LLM call as the gateway saw it.

    ``prompt_ids``, ``completion_ids`` and ``completion_logprobs`` are the sampler's own (absent for hosted providers, which do not
    return them). ``segment`` counts token-level segments within a (session, role): it grows
    when a chat history did not extend the previous turn, so no turn is silently re-tokenized.
    ``status`` is ``abort`` when the client went away mid-stream; the record is then partial.
    Data-URI images in ``messages`` are kept by content address: the blocks hold
    ``rllm-image:sha256:<hex>`` and ``images`` maps each hash to its data URI, once
    (``rllm.types.images.restore_images`` puts them back).
    """

    session_id: str
    id: str = msgspec.field(default_factory=new_id)
    role: str = "default"
    seq: int = 0
    model: str = ""
    messages: list[Message] = msgspec.field(default_factory=list)
    response: Message | None = None
    prompt_ids: TokenArray | None = None
    completion_ids: TokenArray | None = None
    completion_logprobs: FloatArray | None = None
    finish_reason: str | None = None
    weight_version: int | None = None
    # The policy that answered, where a run trains several (rllm.gateway.policy_routes).
    policy: str | None = None
    segment: int = 0
    status: TraceStatus = "ok"
    latency_s: float = 0.0
    created_at: float = msgspec.field(default_factory=time.time)
    usage: Usage = msgspec.field(default_factory=Usage)
    raw_request: dict[str, Any] | None = None
    raw_response: dict[str, Any] | None = None
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    images: dict[str, str] = msgspec.field(default_factory=dict)
    schema_version: int = msgspec.field(default_factory=current_schema_version)
    _v1_logprobs: FloatArray | None = msgspec.field(default=None, name="logprobs")  # schema 1's name

    def __post_init__(self) -> None:
        check_schema_version(self.schema_version)
        if self._v1_logprobs is not None:
            if self.completion_logprobs is None:
                self.completion_logprobs = self._v1_logprobs
            self._v1_logprobs = None
        self.prompt_ids = as_token_array(self.prompt_ids)
        self.completion_ids = as_token_array(self.completion_ids)
        self.completion_logprobs = lp = as_float_array(self.completion_logprobs)
        if lp is not None and self.completion_ids is not None and len(lp) != len(self.completion_ids):
            raise InvariantError(
                f"expected {len(self.completion_ids)} logprobs (one per completion token), got {len(lp)}",
                "completion_logprobs",
            )
