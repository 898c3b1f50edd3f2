"""Tasks, agent configuration and evaluator outputs."""

from __future__ import annotations

from typing import Any

import msgspec

from rllm.types.errors import InvariantError
from rllm.types.messages import ContentBlock

# Metadata keys no agent ever sees (see :func:`agent_view`): a task directory's hidden ``tests``,
# its reference ``solution`` and its ``sandbox`` spec (built on the host from the full task; its
# setup script may hold the answer, and what it puts in the sandbox the agent finds there anyway).
GRADER_ONLY_METADATA: frozenset[str] = frozenset({"tests", "solution", "sandbox"})
# A task's own list of further grader-only metadata keys (e.g. ``["reference", "table"]``).
GRADER_ONLY_KEY = "grader_only"
_ALWAYS_HIDDEN = GRADER_ONLY_METADATA | {GRADER_ONLY_KEY}


class Task(msgspec.Struct, omit_defaults=True):
    """One dataset row: what the agent is asked, and what the evaluator checks against.

    The agent sees only :func:`agent_view` of it: no ``ground_truth``, and no grader-only
    metadata (:data:`GRADER_ONLY_METADATA`, plus the keys the task lists in
    ``metadata["grader_only"]``, a list of key names checked here)."""

    id: str
    instruction: str | list[ContentBlock]
    ground_truth: Any = None
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        marked = self.metadata.get(GRADER_ONLY_KEY)
        if marked is not None and (
            not isinstance(marked, list) or not all(isinstance(key, str) for key in marked)
        ):
            raise InvariantError(
                f"task {self.id!r}: metadata[{GRADER_ONLY_KEY!r}] must be a list of metadata key "
                f"names, got {marked!r}",
                f"metadata.{GRADER_ONLY_KEY}",
            )


def grader_only_keys(task: Task) -> frozenset[str]:
    """The metadata keys of ``task`` only its grader may see (present or not)."""
    marked = task.metadata.get(GRADER_ONLY_KEY)
    return _ALWAYS_HIDDEN.union(marked) if marked else _ALWAYS_HIDDEN


def agent_view(task: Task) -> Task:
    """What the agent may see of ``task``: its id, instruction and the metadata that is not
    grader-only — never ``ground_truth``, a task directory's tests, solution or sandbox spec, nor
    a key the task lists in ``metadata["grader_only"]``.

    The one place that decides it: the engine hands every flow this view (in process, in flow
    processes, on Ray, to remote agent services), and command harnesses get it as ``RLLM_TASK``;
    evaluators get the full task. ``task`` itself when it hides nothing (the common case costs no
    copy); otherwise a new Task whose metadata is a new dict."""
    hidden = grader_only_keys(task)
    if task.ground_truth is None and hidden.isdisjoint(task.metadata):
        return task
    return Task(
        id=task.id,
        instruction=task.instruction,
        metadata={key: value for key, value in task.metadata.items() if key not in hidden},
    )


class SamplingParams(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True):
    """How to sample. Unknown keys are refused: a typo (``temprature``) must not run silently."""

    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    stop: list[str] | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature is not None and self.temperature < 0:
            raise InvariantError(f"temperature must be >= 0, got {self.temperature}", "temperature")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise InvariantError(f"top_p must be in (0, 1], got {self.top_p}", "top_p")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise InvariantError(f"max_tokens must be >= 1, got {self.max_tokens}", "max_tokens")


class AgentConfig(msgspec.Struct, omit_defaults=True):
    """What an agent needs to reach its model: the session's OpenAI-compatible base URL.

    ``base_url`` already routes to this rollout's session; ``api_key`` is the session token
    when the gateway requires auth.
    """

    base_url: str
    model: str = "default"
    session_id: str = ""
    api_key: str = "EMPTY"
    sampling: SamplingParams = msgspec.field(default_factory=SamplingParams)
    is_validation: bool = False
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)


class Signal(msgspec.Struct, omit_defaults=True):
    """A named scalar an evaluator reports beside the reward (e.g. format_ok, tool_calls)."""

    name: str
    value: float
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)


class EvalOutput(msgspec.Struct, omit_defaults=True):
    """An evaluator's verdict on one episode.

    ``trajectory_rewards`` maps a role name to its own reward, for flows whose roles are
    scored separately (e.g. a judge rewarded for agreeing with the ground truth). A key may also
    be one trajectory's id, which wins over its role name (several trajectories of one role
    rewarded one by one, as in ``rllm.sdk.v1``).
    """

    reward: float
    is_correct: bool | None = None
    signals: list[Signal] = msgspec.field(default_factory=list)
    trajectory_rewards: dict[str, float] | None = None
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
