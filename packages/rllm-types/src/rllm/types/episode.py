"""Steps, trajectories and episodes: what one rollout of an agent produced."""

from __future__ import annotations

import enum
import os
from typing import Any

import msgspec

from rllm.types.arrays import Advantage, FloatArray, TokenArray, as_float_array, as_token_array
from rllm.types.errors import InvariantError
from rllm.types.messages import Message
from rllm.types.task import Signal
from rllm.types.version import check_schema_version, current_schema_version


def new_id() -> str:
    """A short random id (16 hex digits) for steps, trajectories, episodes and traces.

    os.urandom directly: uuid4() costs several times more, and ids are made on every LLM call.
    """
    return os.urandom(8).hex()


class TerminationReason(enum.StrEnum):
    """Why an episode ended. Every episode has one, also when it failed."""

    DONE = "done"
    MAX_TURNS = "max_turns"
    TIMEOUT = "timeout"
    AGENT_ERROR = "agent_error"
    INFRA_ERROR = "infra_error"
    CONTEXT_LIMIT = "context_limit"
    TRUNCATED = "truncated"


class ErrorInfo(msgspec.Struct, omit_defaults=True):
    """What went wrong in a rollout or evaluator: exception type, message and traceback."""

    type: str
    message: str
    traceback: str | None = None

    @classmethod
    def from_exception(cls, exc: BaseException) -> ErrorInfo:
        import traceback

        return cls(
            type=type(exc).__name__,
            message=str(exc),
            traceback="".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        )


class Step(msgspec.Struct, omit_defaults=True, repr_omit_defaults=True):
    """One model call: what went in, what came out, and the exact tokens the sampler produced.

    ``prompt_ids`` / ``completion_ids`` / ``completion_logprobs`` are the sampler's own, with the
    trace's names (``rllm.types.TraceRecord``). ``advantage`` is one float for the whole
    completion or a FloatArray with one value per completion token. ``images`` maps the sha256
    of each image in ``input`` to its data URI (the blocks hold ``rllm-image:sha256:<hex>``
    references; see ``rllm.types.images``).
    """

    id: str = msgspec.field(default_factory=new_id)
    input: list[Message] = msgspec.field(default_factory=list)
    output: Message | None = None
    prompt_ids: TokenArray | None = None
    completion_ids: TokenArray | None = None
    completion_logprobs: FloatArray | None = None
    reward: float | None = None
    done: bool = False
    advantage: Advantage | None = None
    weight_version: int | None = None
    finish_reason: str | None = None
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    timing: dict[str, float] = msgspec.field(default_factory=dict)
    images: dict[str, str] = msgspec.field(default_factory=dict)
    # Schema 1's names, read from old files and moved to the new fields (never written).
    _v1_response_ids: TokenArray | None = msgspec.field(default=None, name="response_ids")
    _v1_logprobs: FloatArray | None = msgspec.field(default=None, name="logprobs")

    def __post_init__(self) -> None:
        if self._v1_response_ids is not None or self._v1_logprobs is not None:
            self._upgrade_v1()
        self.prompt_ids = as_token_array(self.prompt_ids)
        self.completion_ids = as_token_array(self.completion_ids)
        self.completion_logprobs = as_float_array(self.completion_logprobs)
        n = None if self.completion_ids is None else len(self.completion_ids)
        if self.completion_logprobs is not None and n is not None and len(self.completion_logprobs) != n:
            raise InvariantError(
                f"expected {n} logprobs (one per completion token), got {len(self.completion_logprobs)}",
                "completion_logprobs",
            )
        adv = self.advantage
        if adv is not None and not isinstance(adv, float | int):
            adv = self.advantage = as_float_array(adv)
            if n is not None and len(adv) != n:
                raise InvariantError(
                    f"expected a scalar or {n} per-token advantages, got {len(adv)}", "advantage"
                )

    def _upgrade_v1(self) -> None:
        if self.completion_ids is None:
            self.completion_ids = self._v1_response_ids
        if self.completion_logprobs is None:
            self.completion_logprobs = self._v1_logprobs
        self._v1_response_ids = self._v1_logprobs = None


class Trajectory(msgspec.Struct, omit_defaults=True, repr_omit_defaults=True):
    """The steps of one role within an episode, e.g. "solver" or "judge" (the traces' ``role``)."""

    id: str = msgspec.field(default_factory=new_id)
    role: str = "default"
    steps: list[Step] = msgspec.field(default_factory=list)
    reward: float | None = None
    signals: list[Signal] = msgspec.field(default_factory=list)
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    _v1_name: str | None = msgspec.field(default=None, name="name")  # schema 1's name for ``role``

    def __post_init__(self) -> None:
        if self._v1_name is not None:
            self.role, self._v1_name = self._v1_name, None


class Episode(msgspec.Struct, omit_defaults=True):
    """One rollout of an agent on one task: its trajectories, outcome and why it ended.

    ``images`` holds the data URIs of its steps' images, each once, when the episode was packed
    for storage (``rllm.types.images.pack_episode_images``): the steps' ``images`` then map
    their hashes to "" and are filled from here again when the episode is decoded.
    """

    task_id: str
    rollout_index: int = 0
    id: str = msgspec.field(default_factory=new_id)
    trajectories: list[Trajectory] = msgspec.field(default_factory=list)
    artifacts: dict[str, Any] = msgspec.field(default_factory=dict)
    is_correct: bool | None = None
    termination_reason: TerminationReason = TerminationReason.DONE
    error: ErrorInfo | None = None
    metrics: dict[str, float] = msgspec.field(default_factory=dict)
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    images: dict[str, str] = msgspec.field(default_factory=dict)
    schema_version: int = msgspec.field(default_factory=current_schema_version)

    def __post_init__(self) -> None:
        check_schema_version(self.schema_version)
        if self.rollout_index < 0:
            raise InvariantError(f"rollout_index must be >= 0, got {self.rollout_index}", "rollout_index")
        if self.images:
            self._restore_step_images()

    def _restore_step_images(self) -> None:
        """Fill the steps' packed image references ("" values) from the episode's own map."""
        shared = self.images
        for t, trajectory in enumerate(self.trajectories):
            for k, step in enumerate(trajectory.steps):
                for digest, uri in step.images.items():
                    if uri:
                        continue
                    if digest not in shared:
                        raise InvariantError(
                            f"image {digest[:12]}... is not in the episode's images",
                            f"trajectories[{t}].steps[{k}].images",
                        )
                    step.images[digest] = shared[digest]

    def trajectory(self, role: str) -> Trajectory | None:
        """The first trajectory with this role, if any."""
        return next((t for t in self.trajectories if t.role == role), None)


class TrajectoryGroup(msgspec.Struct, omit_defaults=True, repr_omit_defaults=True):
    """Trajectories of one role across the rollouts of one task: the unit advantages compare."""

    task_id: str
    role: str = ""
    trajectories: list[Trajectory] = msgspec.field(default_factory=list)
    episode_ids: list[str] = msgspec.field(default_factory=list)
    # Why each member's episode ended (parallel to trajectories), so filters can mask failed
    # rollouts without the episodes at hand.
    termination_reasons: list[TerminationReason] = msgspec.field(default_factory=list)
    schema_version: int = msgspec.field(default_factory=current_schema_version)
    _v1_name: str | None = msgspec.field(default=None, name="name")  # schema 1's name for ``role``

    def __post_init__(self) -> None:
        check_schema_version(self.schema_version)
        if self._v1_name is not None:
            self.role, self._v1_name = self._v1_name, None
        if self.episode_ids and len(self.episode_ids) != len(self.trajectories):
            raise InvariantError(
                f"expected {len(self.trajectories)} episode_ids (one per trajectory), got {len(self.episode_ids)}",
                "episode_ids",
            )
        if self.termination_reasons and len(self.termination_reasons) != len(self.trajectories):
            raise InvariantError(
                f"expected {len(self.trajectories)} termination_reasons (one per trajectory), "
                f"got {len(self.termination_reasons)}",
                "termination_reasons",
            )
