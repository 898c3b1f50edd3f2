"""Build an Episode from what a flow returned plus the gateway's traces of its session.

Traces are the token truth: each becomes one Step carrying the sampler's prompt ids, completion
ids, logprobs and weight version. Traces are grouped into trajectories by their ``role`` (the
URL the flow used, see ``rllm.sdk.role_url``) and ordered by ``seq``; what the flow returned is
matched to them by trajectory *role*, never by position. A role whose chat history stopped
extending (thinking stripped, context compacted) spans several token segments; each Step keeps
its ``metadata["segment"]`` so the trainer merges turns only within one segment.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rllm.sdk.errors import FlowReturnError
from rllm.types import Episode, ErrorInfo, Step, TerminationReason, TraceRecord, Trajectory


def step_from_trace(trace: TraceRecord, shared_images: dict[str, str] | None = None) -> Step:
    """One Step for one recorded LLM call. ``shared_images`` (hash -> data URI) makes the steps
    of one episode hold one string per distinct image, however many traces carried it."""
    images = dict(trace.images)
    if shared_images is not None:
        images = {digest: shared_images.setdefault(digest, uri) for digest, uri in images.items()}
    metadata: dict[str, Any] = {
        "trace_id": trace.id,
        "seq": trace.seq,
        "segment": trace.segment,
        "model": trace.model,
    }
    if "segment_reason" in trace.metadata:  # why the gateway started a new token segment here
        metadata["segment_reason"] = trace.metadata["segment_reason"]
    if trace.policy is not None:  # the policy that answered (several policies train)
        metadata["policy"] = trace.policy
    if "version_spans" in trace.metadata:  # a partial rollout's call: which version sampled which tokens
        metadata["version_spans"] = trace.metadata["version_spans"]
    return Step(
        input=list(trace.messages),
        output=trace.response,
        prompt_ids=trace.prompt_ids,
        completion_ids=trace.completion_ids,
        completion_logprobs=trace.completion_logprobs,
        weight_version=trace.weight_version,
        finish_reason=trace.finish_reason,
        metadata=metadata,
        timing={"latency_s": trace.latency_s},
        images=images,
    )


def trajectories_from_traces(traces: Sequence[TraceRecord]) -> dict[str, Trajectory]:
    """Trajectories keyed by role, in order of each role's first call; steps ordered by seq.

    Traces that did not complete (``status`` error or abort) carry no usable completion and are
    left out of the steps; their count is kept in ``metadata["dropped_traces"]``.
    """
    by_role: dict[str, list[TraceRecord]] = {}
    for trace in sorted(traces, key=lambda t: t.seq):
        by_role.setdefault(trace.role, []).append(trace)
    out: dict[str, Trajectory] = {}
    shared_images: dict[str, str] = {}
    for role, records in by_role.items():
        ok = [t for t in records if t.status == "ok"]
        steps = [step_from_trace(t, shared_images) for t in ok]
        if steps:
            steps[-1].done = True
        metadata: dict[str, Any] = {"segments": len({t.segment for t in ok})}
        if len(ok) != len(records):
            metadata["dropped_traces"] = len(records) - len(ok)
        out[role] = Trajectory(role=role, steps=steps, metadata=metadata)
    return out


def _as_episode(result: Any, task_id: str) -> Episode:
    if result is None:
        return Episode(task_id=task_id)
    if isinstance(result, Episode):
        return result
    if isinstance(result, Trajectory):
        return Episode(task_id=task_id, trajectories=[result])
    if isinstance(result, dict):
        return Episode(task_id=task_id, artifacts=dict(result))
    if isinstance(result, str):
        return Episode(task_id=task_id, artifacts={"answer": result})
    raise FlowReturnError(
        f"a flow must return an Episode, Trajectory, dict, str or None; got {type(result).__name__} ({result!r:.80})"
    )


def _merge(user: Trajectory, traced: Trajectory | None) -> Trajectory:
    """The flow's trajectory (role, reward, signals, metadata) with the traced steps.

    Traced steps win over steps the flow built itself: they hold the sampler's exact tokens. A
    flow's own steps survive only for a role the gateway never saw (e.g. no gateway in the path).
    """
    if traced is None:
        return user
    if user.steps and traced.steps:
        traced.metadata["flow_steps_replaced"] = len(user.steps)
    return Trajectory(
        id=user.id,
        role=user.role,
        steps=traced.steps or user.steps,
        reward=user.reward,
        signals=list(user.signals),
        metadata={**traced.metadata, **user.metadata},
    )


def build_episode(
    task_id: str,
    rollout_index: int,
    result: Any,
    traces: Sequence[TraceRecord],
) -> Episode:
    """The Episode for one rollout. Raises FlowReturnError if ``result`` has an unusable type.

    ``task_id`` and ``rollout_index`` are the engine's (a flow cannot relabel its rollout).
    """
    episode = _as_episode(result, task_id)
    traced = trajectories_from_traces(traces)
    trajectories: list[Trajectory] = []
    for user in episode.trajectories:
        trajectories.append(_merge(user, traced.pop(user.role, None)))
    trajectories.extend(traced.values())
    episode.trajectories = trajectories
    episode.task_id = task_id
    episode.rollout_index = rollout_index
    episode.metrics.update(trace_metrics(traces))
    return episode


def trace_metrics(traces: Sequence[TraceRecord]) -> dict[str, float]:
    """Token and call counts of a session (usage when the sampler reported it, else id lengths)."""
    prompt = completion = 0
    latency = 0.0
    for t in traces:
        prompt += t.usage.prompt_tokens or (len(t.prompt_ids) if t.prompt_ids is not None else 0)
        completion += t.usage.completion_tokens or (
            len(t.completion_ids) if t.completion_ids is not None else 0
        )
        latency += t.latency_s
    return {
        "llm_calls": float(len(traces)),
        "llm_errors": float(sum(t.status != "ok" for t in traces)),
        "prompt_tokens": float(prompt),
        "completion_tokens": float(completion),
        "llm_latency_s": latency,
    }


def failed_episode(
    task_id: str,
    rollout_index: int,
    reason: TerminationReason,
    error: ErrorInfo | None,
    traces: Sequence[TraceRecord] = (),
) -> Episode:
    """An Episode for a rollout that did not finish: whatever was traced, plus why it ended."""
    episode = build_episode(task_id, rollout_index, None, traces)
    episode.termination_reason = reason
    episode.error = error
    return episode
