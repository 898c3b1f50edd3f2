"""The remote agent protocol: how the engine asks an agent service for one rollout.

``POST /rollouts`` with a :class:`RolloutRequest` (``{task, config: {base_url, api_key, model,
sampling, ...}}``; ``task`` is the agent's view, ``rllm.types.agent_view``: no ground truth, no
grader-only metadata); the service runs its agent against ``config.base_url`` (the rollout's
gateway session, which captures every LLM call) and answers 200 with either a whole Episode of
that task id or just ``{answer, artifacts, metrics, metadata}`` (the engine builds the rest from
the gateway's traces). An answer never carries a reward: the trainer's evaluator gives it.
A flow failure the service classified itself is answered 422 with
``{error: {type, message}, termination_reason}``; any other status, a dropped connection or a body
that is not one of these is the service's fault (an infrastructure error, retried elsewhere).
``GET /health`` answers ``{status: "ok", active, capacity}``. The JSON schema is
docs/remote-agents.schema.json (checked against these structs by the tests).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import msgspec

from rllm.types import AgentConfig, Episode, Task, TerminationReason, Trajectory, convert, to_json
from rllm.types.errors import RLLMError, SchemaError

PROTOCOL_VERSION = 1


# The fields the engine always sends, so a service may rely on them: first and required on the
# wire (AgentConfig gives model and api_key defaults). The rest keep AgentConfig's defaults.
WIRE_REQUIRED = ("base_url", "api_key", "model")


def _wire_struct() -> type[msgspec.Struct]:
    """AgentConfig on the wire: its fields, declared there once (a field added to AgentConfig is
    sent and received without a change here), ``WIRE_REQUIRED`` first and required."""
    fields = {f.name: f for f in msgspec.structs.fields(AgentConfig)}
    spec: list[tuple[str, Any] | tuple[str, Any, Any]] = [(name, fields[name].type) for name in WIRE_REQUIRED]
    for f in fields.values():
        if f.name not in WIRE_REQUIRED:
            default = (
                f.default
                if f.default is not msgspec.NODEFAULT
                else msgspec.field(default_factory=f.default_factory)
            )
            spec.append((f.name, f.type, default))
    struct = msgspec.defstruct("RemoteConfig", spec, kw_only=True, omit_defaults=True, module=__name__)
    struct.__doc__ = (
        "What the agent needs to talk to the model for this rollout (an AgentConfig on the wire)."
    )
    return struct


if TYPE_CHECKING:  # to a type checker it is AgentConfig: the same fields, built from them below
    RemoteConfig = AgentConfig
else:
    RemoteConfig = _wire_struct()


def to_wire(config: AgentConfig) -> RemoteConfig:
    """The engine's side: the AgentConfig of a rollout as the request's ``config``. SchemaError
    naming the key for a non-finite float in ``metadata``: JSON has none, and the encoder would
    send it as ``null``, a value the agent never had."""
    _check_finite(config.metadata, "config.metadata")
    return RemoteConfig(**{name: getattr(config, name) for name in AgentConfig.__struct_fields__})


def _check_finite(value: Any, path: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise SchemaError(f"{value!r} has no JSON form", path)
    if isinstance(value, dict):
        for key, item in value.items():
            _check_finite(item, f"{path}.{key}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_finite(item, f"{path}[{i}]")


def from_wire(config: RemoteConfig) -> AgentConfig:
    """The service's side: the request's ``config`` as the AgentConfig its flow is called with."""
    return AgentConfig(**{name: getattr(config, name) for name in AgentConfig.__struct_fields__})


class RolloutRequest(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The body of ``POST /rollouts``. ``task`` is the agent's view of the task (no ground truth,
    no grader-only metadata); ``deadline_s`` is the engine's deadline for this attempt."""

    task: Task
    config: RemoteConfig
    deadline_s: float | None = None
    protocol: int = PROTOCOL_VERSION


class RolloutAnswer(msgspec.Struct, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """The short answer: what the agent produced; the steps come from the gateway's traces. No
    reward (not even a ``reward`` metric): the trainer's evaluator gives it."""

    answer: str | None = None
    artifacts: dict[str, Any] = msgspec.field(default_factory=dict)
    metrics: dict[str, float] = msgspec.field(default_factory=dict)
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)


class ErrorBody(msgspec.Struct, kw_only=True):
    type: str
    message: str


class RolloutFailure(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The 422 body: the agent failed, and the service says how."""

    error: ErrorBody
    termination_reason: TerminationReason = TerminationReason.AGENT_ERROR


class Health(msgspec.Struct, kw_only=True):
    status: str
    active: int = 0
    capacity: int | None = None


class RemoteProtocolError(RLLMError, ConnectionError):
    """An agent service answered something that is not the protocol (an infrastructure error)."""


class RemoteAgentError(RLLMError, RuntimeError):
    """An agent service ran the rollout and its agent failed; carries the service's classification."""

    def __init__(
        self, message: str, *, termination_reason: TerminationReason, details: dict[str, Any]
    ) -> None:
        super().__init__(message)
        self.termination_reason = termination_reason
        self.episode_metadata = {"remote": details}


def decode_answer(body: bytes, task_id: str) -> Episode:
    """The Episode a 200 answer stands for; RemoteProtocolError for anything else, an Episode of
    another task id or an answer that claims a reward (:func:`claimed_reward`) included."""
    try:
        doc = msgspec.json.decode(body)
    except msgspec.DecodeError:
        raise RemoteProtocolError(f"the agent service answered non-JSON: {body[:80]!r}") from None
    if not isinstance(doc, dict):
        raise RemoteProtocolError(f"the agent service answered {type(doc).__name__}, not a JSON object")
    try:
        if "task_id" in doc or "trajectories" in doc:
            episode = convert(doc, Episode)
        else:
            short = convert(doc, RolloutAnswer)
            artifacts = dict(short.artifacts)
            if short.answer is not None:
                artifacts["answer"] = short.answer
            episode = Episode(
                task_id=task_id,
                artifacts=artifacts,
                metrics=dict(short.metrics),
                metadata=dict(short.metadata),
            )
    except (msgspec.ValidationError, ValueError, TypeError) as exc:
        raise RemoteProtocolError(
            f"the agent service's answer is not an Episode or {{answer, artifacts}}: {exc}"
        ) from None
    if episode.task_id != task_id:
        raise RemoteProtocolError(
            f"the agent service answered an episode of task {episode.task_id!r} to a rollout of task {task_id!r}"
        )
    claim = claimed_reward(episode)
    if claim is not None:
        raise RemoteProtocolError(
            f"the agent service's answer claims a reward ({claim}); rewards come from the trainer's "
            "evaluator, never from the agent"
        )
    return episode


def claimed_reward(episode: Episode) -> str | None:
    """Where ``episode`` (an agent service's answer) reports a reward of its own, or None: a
    trajectory's or a step's reward or advantage, ``is_correct`` or a ``reward`` metric."""
    if episode.is_correct is not None:
        return f"is_correct={episode.is_correct}"
    if "reward" in episode.metrics:
        return f"metrics.reward={episode.metrics['reward']}"
    for t, trajectory in enumerate(episode.trajectories):
        if trajectory.reward is not None:
            return f"trajectories[{t}].reward={trajectory.reward}"
        for i, step in enumerate(trajectory.steps):
            if step.reward is not None or step.advantage is not None:
                return f"trajectories[{t}].steps[{i}] reward/advantage"
    return None


def decode_failure(body: bytes) -> RolloutFailure:
    try:
        return msgspec.json.decode(body, type=RolloutFailure)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise RemoteProtocolError(
            f"the agent service's 422 answer is not {{error, termination_reason}}: {exc}"
        ) from None


def encode_result(result: Any, task_id: str) -> bytes:
    """A flow's result as a 200 body (the service side of :func:`decode_answer`)."""
    if result is None:
        return b"{}"
    if isinstance(result, str):
        return msgspec.json.encode(RolloutAnswer(answer=result))
    if isinstance(result, dict):
        return msgspec.json.encode(RolloutAnswer(artifacts=result))
    if isinstance(result, Trajectory):
        result = Episode(task_id=task_id, trajectories=[result])
    return to_json(result)


SCHEMA_PATH = "docs/remote-agents.schema.json"


def protocol_schema() -> dict[str, Any]:
    """The protocol's JSON schema, generated from the structs above (docs/ holds a copy that a
    test compares with this)."""
    (request, answer, failure, health), components = msgspec.json.schema_components(
        [RolloutRequest, RolloutAnswer, RolloutFailure, Health], ref_template="#/$defs/{name}"
    )
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"rLLM remote agent protocol v{PROTOCOL_VERSION}",
        "description": (
            "POST /rollouts takes `request`; 200 answers `answer` (or a whole Episode, the rllm.types "
            "JSON), 422 answers `failure`; any other answer is an infrastructure error. GET /health "
            "answers `health`."
        ),
        "properties": {"request": request, "answer": answer, "failure": failure, "health": health},
        "$defs": components,
    }


def write_schema(path: str = SCHEMA_PATH) -> None:
    """Regenerate docs/remote-agents.schema.json (run from the repository root)."""
    import json
    from pathlib import Path

    Path(path).write_text(json.dumps(protocol_schema(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
