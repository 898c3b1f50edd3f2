"""Token truth while training: the train/sampler mismatch of every step, and token segments.

A backend that computes the policy's logprobs for its loss writes them onto each
``TrainSequence.trainer_logprobs`` (before the step's first update, so they come from the weights
the sampler sampled with). Where the tokens trained on are the tokens sampled, trainer and sampler
logprobs agree up to numerics; a chat template, tool parser or router that changed the ids shows
up as a gap. ``measure_mismatch`` maps the trainer's logprobs back onto the steps
(``Step.metadata["train_logprobs"]``, which ``rllm view`` colours by) and returns per-step and
per-episode figures; ``check_mismatch`` stops the run above ``algorithm.max_mismatch``.

Asynchronous training (``rollout.max_staleness`` K > 0) trains on tokens sampled up to K weight
versions ago: the trainer's logprobs then differ from the sampler's by the policy's lag as well,
which is no token fault. Given the version the trainer holds (``fresh_version``), only the steps
sampled by that version count towards the figures and the check; the lagged ones still get their
``train_logprobs`` (the viewer shows them) and are counted in ``mismatch/lagged_tokens``.

The figures, over the sampled (loss-mask 1) tokens, with r = trainer - sampler logprob:
mean and max |r|, the fraction of tokens with |r| > 0.5 nats, and KL(sampler || trainer)
estimated with k3 = e^r - 1 - r (non-negative, unbiased for samples drawn by the sampler).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

import msgspec

from rllm.engine.training.staleness import step_versions
from rllm.types import Episode, Step, TrainSequence
from rllm.types.errors import StateError

DRIFT_NATS = 0.5  # a token whose |trainer - sampler| logprob exceeds this has drifted


class TokenMismatchError(StateError):
    """The tokens trained on are not the tokens the model sampled (``algorithm.max_mismatch``)."""


class TokenDrift(msgspec.Struct, kw_only=True):
    """One sampled token whose trainer logprob differs from the sampler's."""

    episode_id: str
    task_id: str
    role: str
    turn: int  # index of the step in its trajectory
    position: int  # index of the token in the step's completion
    token_id: int
    sampler_logprob: float
    trainer_logprob: float


class MismatchReport(msgspec.Struct, kw_only=True):
    """One step's mismatch: ``metrics`` (empty when the backend recorded no trainer logprobs),
    the episode with the largest mean |r| and its first drifting token."""

    metrics: dict[str, float]
    recorded: bool
    worst_episode: str | None = None
    worst_episode_mean: float = 0.0
    first_drift: TokenDrift | None = None


def measure_mismatch(
    sequences: Sequence[TrainSequence], episodes: Sequence[Episode], fresh_version: int | None = None
) -> MismatchReport:
    """Map trainer logprobs onto the episodes' steps and measure the mismatch.

    Writes ``Step.metadata["train_logprobs"]`` (one per completion token) and, on each episode
    with trained tokens, ``Episode.metrics["mismatch/*"]``; segment counts are measured whether or
    not the backend recorded logprobs. With ``fresh_version`` (the weights the trainer's logprobs
    come from), a step sampled by another version is left out of the figures (its gap includes
    the policy's lag) and counted in ``mismatch/lagged_tokens``; a step that carries no version
    counts.
    """
    metrics = segment_metrics(episodes)
    steps = _steps_by_trajectory(episodes)
    recorded = False
    for seq in sequences:
        if seq.trainer_logprobs is None:
            continue
        recorded = True
        trainer = seq.trainer_logprobs
        trajectory_steps = steps.get(str(seq.metadata.get("trajectory_id", "")), [])
        for index, start, end in seq.metadata.get("step_spans", []):
            if index < len(trajectory_steps):
                trajectory_steps[index].metadata["train_logprobs"] = trainer[start:end].tolist()
    if not recorded:
        return MismatchReport(metrics=metrics, recorded=False)
    report = _report(episodes, fresh_version, None)
    report.metrics = metrics | report.metrics
    return report


def measure_policy_mismatch(
    sequences: Sequence[TrainSequence], episodes: Sequence[Episode], fresh_version: int | None = None
) -> dict[str, MismatchReport]:
    """Several policies (rllm.engine.training.policies): each policy's mismatch over the
    trajectories it trained (``TrainSequence.metadata["policy"]``), its figures under
    ``policy/NAME/mismatch/...``; after ``measure_mismatch`` (which put the trainer's logprobs
    onto the steps). A policy that trained nothing this step has no report; one whose backend
    recorded no trainer logprobs has an empty one (``recorded`` False)."""
    trained: dict[str, set[str]] = {}
    recorded: dict[str, bool] = {}
    for seq in sequences:
        name = str(seq.metadata.get("policy", ""))
        trained.setdefault(name, set()).add(str(seq.metadata.get("trajectory_id", "")))
        recorded[name] = recorded.get(name, False) or seq.trainer_logprobs is not None
    out: dict[str, MismatchReport] = {}
    for name, trajectories in trained.items():
        if not recorded[name]:
            out[name] = MismatchReport(metrics={}, recorded=False)
            continue
        report = _report(episodes, fresh_version, trajectories)
        report.metrics = {f"policy/{name}/{key}": value for key, value in report.metrics.items()}
        out[name] = report
    return out


def _report(
    episodes: Sequence[Episode], fresh_version: int | None, trajectories: set[str] | None
) -> MismatchReport:
    """The figures over the steps that carry trainer logprobs (of ``trajectories`` only, when
    given; the run's figures, ``trajectories`` None, also go onto each episode's metrics)."""
    metrics: dict[str, float] = {}
    all_gaps: list[float] = []
    lagged = 0
    worst: tuple[float, Episode] | None = None
    for episode in episodes:
        gaps = []
        for _, _, step, step_gaps in _episode_gaps(episode, trajectories):
            if _lagged(step, fresh_version):
                lagged += len(step_gaps)
            else:
                gaps.extend(step_gaps)
        if not gaps:
            continue
        all_gaps.extend(gaps)
        figures = _figures(gaps)
        if trajectories is None:
            episode.metrics.update({f"mismatch/{k}": v for k, v in figures.items()})
        if worst is None or figures["mean_abs"] > worst[0]:
            worst = (figures["mean_abs"], episode)
    if fresh_version is not None:
        metrics["mismatch/lagged_tokens"] = float(lagged)
    if not all_gaps:
        return MismatchReport(metrics=metrics, recorded=True)
    metrics.update({f"mismatch/{k}": v for k, v in _figures(all_gaps).items()})
    assert worst is not None
    return MismatchReport(
        metrics=metrics,
        recorded=True,
        worst_episode=worst[1].id,
        worst_episode_mean=worst[0],
        first_drift=first_drift(worst[1], trajectories),
    )


def _lagged(step: Step, fresh_version: int | None) -> bool:
    """True when another weight version than the trainer's sampled some of the step's tokens."""
    return fresh_version is not None and any(v != fresh_version for v in step_versions(step))


def first_drift(episode: Episode, trajectories: set[str] | None = None) -> TokenDrift | None:
    """The episode's first token with |r| > DRIFT_NATS, else its largest |r| (None: nothing
    recorded); of ``trajectories`` only, when given."""
    largest: tuple[float, TokenDrift] | None = None
    for role, turn, step, gaps in _episode_gaps(episode, trajectories):
        for position, gap in enumerate(gaps):
            if abs(gap) > DRIFT_NATS or largest is None or abs(gap) > largest[0]:
                assert step.completion_ids is not None and step.completion_logprobs is not None
                drift = TokenDrift(
                    episode_id=episode.id,
                    task_id=episode.task_id,
                    role=role,
                    turn=turn,
                    position=position,
                    token_id=int(step.completion_ids[position]),
                    sampler_logprob=float(step.completion_logprobs[position]),
                    trainer_logprob=float(step.metadata["train_logprobs"][position]),
                )
                if abs(gap) > DRIFT_NATS:
                    return drift
                largest = (abs(gap), drift)
    return largest[1] if largest is not None else None


def check_mismatch(
    report: MismatchReport, limit: float | None, step: int, backend: str, policy: str | None = None
) -> None:
    """Stop the run when the step's mean |trainer - sampler| logprob exceeds ``limit``
    (``policy``: that policy's report, from ``measure_policy_mismatch``; the line names it)."""
    if limit is None:
        return
    whose = f"policy {policy!r}'s " if policy is not None else ""
    if not report.recorded:
        raise StateError(
            f"step {step}: algorithm.max_mismatch is set, but backend {backend!r} recorded no trainer "
            f"logprobs for {whose or 'the '}update (its validate should have refused the option)"
        )
    key = f"policy/{policy}/mismatch/mean_abs" if policy is not None else "mismatch/mean_abs"
    mean = report.metrics.get(key, 0.0)
    if mean <= limit:
        return
    drift = report.first_drift
    where = (
        f"; its first drifting token: role {drift.role!r}, turn {drift.turn}, completion token "
        f"{drift.position} (id {drift.token_id}), sampler logprob {drift.sampler_logprob:.4f}, trainer "
        f"logprob {drift.trainer_logprob:.4f}"
        if drift is not None
        else ""
    )
    task = f" (task {drift.task_id})" if drift is not None else ""
    raise TokenMismatchError(
        f"step {step}: {whose}train/sampler mismatch {mean:.4f} nats (mean |trainer - sampler| logprob over "
        f"sampled tokens) exceeds algorithm.max_mismatch={limit}; worst episode {report.worst_episode}"
        f"{task}, mean {report.worst_episode_mean:.4f}{where}. The tokens trained on are not the "
        "tokens sampled: see docs/token-truth.md"
    )


def segment_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """New token segments started per episode (the gateway's cumulative mode starts one when a
    history does not extend the previous turn), and how many for each reason in this step;
    each episode with trajectories also gets its own count (``metrics["segments/new"]``)."""
    started: list[int] = []
    reasons: Counter[str] = Counter()
    for episode in episodes:
        count = 0
        for trajectory in episode.trajectories:
            previous = None
            for step in trajectory.steps:
                segment = step.metadata.get("segment")
                if previous is not None and segment is not None and segment != previous:
                    count += 1
                    reasons[_slug(str(step.metadata.get("segment_reason", "unknown")))] += 1
                previous = segment
        started.append(count)
        if episode.trajectories:
            episode.metrics["segments/new"] = float(count)  # in the step's sample, per episode
    if not started:
        return {}
    out = {"segments/new_per_episode": sum(started) / len(started)}
    out.update({f"segments/reason/{reason}": float(n) for reason, n in reasons.items()})
    return out


def _slug(reason: str) -> str:
    """A metric-key form of a gateway reason: 'the previous reply was changed (e.g. thinking
    stripped)' -> 'the_previous_reply_was_changed'."""
    head = reason.split(" (", 1)[0]
    return re.sub(r"[^a-z0-9]+", "_", head.lower()).strip("_") or "unknown"


def _steps_by_trajectory(episodes: Sequence[Episode]) -> dict[str, list[Step]]:
    return {t.id: t.steps for e in episodes for t in e.trajectories}


def _episode_gaps(
    episode: Episode, trajectories: set[str] | None = None
) -> list[tuple[str, int, Step, list[float]]]:
    """(role, turn, step, trainer - sampler per completion token) of each step with trainer
    logprobs (of ``trajectories`` only, when given)."""
    out = []
    for trajectory in episode.trajectories:
        if trajectories is not None and trajectory.id not in trajectories:
            continue
        for turn, step in enumerate(trajectory.steps):
            trainer = step.metadata.get("train_logprobs")
            if trainer is None or step.completion_logprobs is None or step.completion_ids is None:
                continue
            sampler = step.completion_logprobs
            out.append(
                (trajectory.role, turn, step, [float(t) - s for t, s in zip(trainer, sampler, strict=False)])
            )
    return out


def _figures(gaps: list[float]) -> dict[str, float]:
    n = len(gaps)
    if n == 0:
        return {"mean_abs": 0.0, "max_abs": 0.0, "frac_over_0.5": 0.0, "kl_k3": 0.0, "tokens": 0.0}
    absolute = [abs(g) for g in gaps]
    # k3 = e^r - 1 - r; r clipped so one wild token cannot overflow the estimate to inf.
    kl = math.fsum(math.expm1(r) - r for r in (min(max(g, -20.0), 20.0) for g in gaps)) / n
    return {
        "mean_abs": math.fsum(absolute) / n,
        "max_abs": max(absolute),
        "frac_over_0.5": sum(a > DRIFT_NATS for a in absolute) / n,
        "kl_k3": kl,
        "tokens": float(n),
    }
