"""One training step, the same in the synchronous and the asynchronous loop.

    finished episodes -> group -> filters -> advantages -> health figures -> TrainSequences ->
    distillation -> backend.train_step -> train/sampler mismatch measured -> the step's sample
    written -> mismatch checked (algorithm.max_mismatch) -> new weights published -> the probe
    set re-scored when due (health: weights_stale, weight_probe.ProbeSchedule) -> metrics

The loops differ only around it: where the episodes come from (the synchronous loop,
``rllm.engine.training.trainer``, rolls out one batch, maybe prefetched; the asynchronous one,
``rllm.engine.training.async_loop``, takes finished groups within the staleness bound) and how new weights
reach the sampler (each passes its own ``publish``: a pause, or a held prefetch, around the sync;
a drain under a watchdog). Everything between lives here once, so whatever the step measures or
enforces holds in both modes, as the capability matrix (docs/capabilities.md) promises.

The health checks (``rllm.engine.training.health``) judge the step's metrics in the Trainer's loop,
after validation; what they need beyond the metrics is measured here, in both modes alike.

The sample is written before the mismatch is checked (the viewer shows where a stopped run
drifted), and the check comes before ``publish``: weights trained on tokens that were not the
tokens sampled never reach the sampler.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rllm.algos import compute_advantages, filter_groups, group_trajectories
from rllm.engine.rollout.worker_metrics import sandbox_step_metrics
from rllm.engine.training.health import HealthMonitor
from rllm.engine.training.health_measure import step_health_metrics
from rllm.engine.training.metrics_log import write_episode_sample
from rllm.engine.training.mismatch import check_mismatch, measure_mismatch, measure_policy_mismatch
from rllm.engine.training.policies import DEFAULT_POLICY, PolicyMap, train_policies
from rllm.engine.training.sequences import sequences_from_groups, signal_sequences
from rllm.engine.training.task_repeats import mark_task_repeats
from rllm.engine.training.weight_probe import ProbeUnavailable, WeightProbe
from rllm.types import ConfigError, Episode, TerminationReason, TrainSequence
from rllm.types.errors import StateError

if TYPE_CHECKING:
    from rllm.engine.backend import Backend
    from rllm.engine.data.distill import Distiller
    from rllm.engine.training.trainer_config import TrainerConfig

Publish = Callable[[], Awaitable[None]]

log = logging.getLogger(__name__)

# A batch where at least this share of the rollouts ended at their deadline says so in one
# warning line: those rollouts train as failures (reward 0), so the run learns from the deadline.
TIMEOUT_WARN_FRACTION = 0.1


class TrainStep:
    """Trains on a batch of finished episodes and publishes the new weights (``run``).

    What the run saw of each task is recorded as the episodes come in, before this step
    (rllm.engine.training.task_sampler), so the next draw and a prefetch know it. One per run:
    ``health`` judges its steps (the Trainer's loop calls it) and ``probes`` hold the probe sets of
    ``weights_stale`` (one per policy)."""

    def __init__(
        self, config: TrainerConfig, backend: Backend, out_dir: Path, *, distiller: Distiller | None = None
    ) -> None:
        self.config, self.backend, self.out_dir = config, backend, out_dir
        self.distiller = distiller
        self.health = HealthMonitor(config.health, max_mismatch=config.algorithm.max_mismatch)
        # Several policies: each trains on its own groups (rllm.engine.training.policies).
        self.policies = (
            PolicyMap(config.policies, config.roles, config.algorithm) if config.policies else None
        )
        # weights_stale's probe sets: one per policy (the default alone in a one-policy run).
        self.probes: dict[str, WeightProbe] = {}
        if config.health.runs("weights_stale") and not getattr(backend, "scores_prompts", True):
            self._probe_failed(ProbeUnavailable(f"backend {backend.name!r}'s sampler does not score prompts"))
        elif config.health.runs("weights_stale"):
            for name in self.policies.names if self.policies is not None else [DEFAULT_POLICY]:
                self.probes[name] = WeightProbe(
                    config.health.probe_sequences,
                    url=lambda: backend.inference_urls()[0],
                    model=self._probe_model(name),
                    max_interval=config.health.probe_max_interval,
                )

    def _probe_model(self, policy: str) -> Callable[[], str]:
        """The model name ``policy`` is sampled under (asked at each scoring)."""
        if self.policies is None:
            return self.backend.served_model_name
        return lambda: self.backend.policy_model_names()[policy]  # pyright: ignore[reportAttributeAccessIssue]

    async def run(
        self, episodes: Sequence[Episode], step: int, publish: Publish, weight_version: int | None = None
    ) -> dict[str, Any]:
        """Update number ``step`` from ``episodes``: train, measure and check the mismatch, write
        the step's sample, then ``publish`` (only when something was trained: no update, no new
        weights). ``weight_version``: the version the trainer's weights are at (the mismatch
        counts only the tokens that version sampled; the asynchronous loop's lagged ones are no
        token fault). Returns the step's metrics; the caller adds its own (timings, weight
        version, staleness)."""
        cfg, algo = self.config, self.config.algorithm
        for probe in self.probes.values():
            probe.step_began()
        stop_if_infrastructure_down(episodes, f"step {step}")
        warn_cut_off(episodes, f"step {step}", cfg.rollout.deadline_s)
        mark_task_repeats(episodes)  # a task drawn twice this step: two groups, not one
        groups = group_trajectories(episodes, algo)
        health_metrics = step_health_metrics(episodes, groups, cfg.health)
        if self.policies is not None:
            probing = await self._probe_start(episodes)
            kept, sequences, policy_metrics = await train_policies(self.policies, groups, self.backend)
            filter_metrics = advantage_metrics = distill_metrics = train_metrics = {}
        else:
            kept, filter_metrics = filter_groups(groups, algo)
            advantage_metrics = compute_advantages(kept, algo)
            sequences = sequences_from_groups(kept)
            distill_metrics = await self.distiller.apply(sequences) if self.distiller and sequences else {}
            train_metrics: dict[str, float] = {}
            policy_metrics: dict[str, float] = {}
            probing = await self._probe_start(episodes) if sequences else set()
            if sequences:
                train_metrics = await self.backend.train_step(sequences, algo)
        # Token truth: trainer vs sampler logprobs onto the steps (the samples show them), then enforced.
        mismatch = measure_mismatch(sequences, episodes, weight_version)
        # Several policies: each policy's own figures, and each checked on its own (the line names it).
        by_policy = measure_policy_mismatch(sequences, episodes, weight_version) if self.policies else {}
        if cfg.sample_groups:
            trained = [t.id for g in kept for t in g.trajectories]
            write_episode_sample(self.out_dir, step, episodes, trained, cfg.sample_groups)
        if sequences:
            if by_policy:
                for name, report in by_policy.items():
                    check_mismatch(report, algo.max_mismatch, step, self.backend.name, policy=name)
            else:
                check_mismatch(mismatch, algo.max_mismatch, step, self.backend.name)
            await publish()
        health_metrics |= await self._probe_measure(probing, sequences)
        return {
            **episode_metrics(episodes),
            **{f"filter/{k}": v for k, v in filter_metrics.items()},
            **{f"advantage/{k}": v for k, v in advantage_metrics.items()},
            **distill_metrics,
            **{f"train/{k}": v for k, v in train_metrics.items()},
            **policy_metrics,  # several policies: policy/NAME/..., and the run-level means
            **mismatch.metrics,
            **{key: value for report in by_policy.values() for key, value in report.metrics.items()},
            "train/sequences": len(sequences),
            "train/signal_sequences": signal_sequences(sequences),
            **health_metrics,
        }

    async def _probe_start(self, episodes: Sequence[Episode]) -> set[str]:
        """The policies whose probe sets this step re-scores after its update: fixes and scores
        each policy's set first (before the first update that has its calls) when it has none."""
        started: set[str] = set()
        policies = self.policies
        for name, probe in list(self.probes.items()):
            if probe.chosen:
                started.add(name)
                continue
            keep = None if policies is None else (lambda t, name=name: policies.trajectory_policy(t) == name)
            try:
                if await probe.start(episodes, keep):
                    started.add(name)
            except ProbeUnavailable as exc:
                self._probe_failed(exc)
                return set()
        return started

    async def _probe_measure(self, probing: set[str], sequences: Sequence[TrainSequence]) -> dict[str, float]:
        """After the update: re-score the probe sets of the policies it trained, where due; the
        least change is the step's ``probe/logprob_change`` (one stale adapter is a stale run).
        Of several policies, only those with a learning signal this step are probed: a policy
        whose sequences all had zero advantage did not move, and its unchanged probe set must
        not count against the run's weight sync."""
        if self.policies is None:
            trained = {DEFAULT_POLICY} if sequences else set()
        else:
            trained = {str(s.metadata.get("policy")) for s in sequences if signal_sequences([s])}
        probed = [name for name in self.probes if name in probing and name in trained]
        if not probed:
            return {}
        out: dict[str, float] = {"time/probe_interval": max(self.probes[n].schedule.interval for n in probed)}
        changes: dict[str, float] = {}
        for name in probed:
            probe = self.probes.get(name)
            if probe is None or not probe.due():
                continue
            try:
                changes[name] = await probe.measure()
            except ProbeUnavailable as exc:
                self._probe_failed(exc)
                return out
        if changes:
            out["probe/logprob_change"] = min(changes.values())
            if self.policies is not None:
                out |= {f"policy/{name}/probe/logprob_change": change for name, change in changes.items()}
        return out

    def _probe_failed(self, exc: ProbeUnavailable) -> None:
        """A sampler that cannot score the probe set: the check is off, said once; refused where
        ``health.stop_on`` counts on it."""
        self.probes = {}
        if "weights_stale" in self.config.health.stop_on:
            raise ConfigError.for_key(
                "health.stop_on", f"weights_stale cannot run with backend {self.backend.name!r}: {exc}"
            ) from None
        self.health.turn_off("weights_stale", str(exc))


def timeout_fraction(episodes: Sequence[Episode]) -> float:
    """The share of ``episodes`` cut off at their deadline (0 for none)."""
    if not episodes:
        return 0.0
    return sum(e.termination_reason == TerminationReason.TIMEOUT for e in episodes) / len(episodes)


def stop_if_infrastructure_down(episodes: Sequence[Episode], where: str) -> None:
    """End the run when every rollout of a batch failed for infrastructure reasons (after the
    engine's retries): nothing is left to train on, and the cause (a sampler that died, an
    upstream that went away) will not mend itself between steps, so going on would only log
    empty steps with exit status 0. One line, naming the first rollout's error."""
    if not episodes or any(e.termination_reason != TerminationReason.INFRA_ERROR for e in episodes):
        return
    first = next((e.error for e in episodes if e.error is not None), None)
    cause = (
        " ".join(f"{first.type}: {first.message}".split())[:400] if first is not None else "no error recorded"
    )
    raise StateError(
        f"{where}: all {len(episodes)} rollouts failed for infrastructure reasons (nothing to train "
        f"on; is the sampler or the gateway's upstream down?); the first: {cause}"
    )


def warn_cut_off(episodes: Sequence[Episode], where: str, deadline_s: float | None) -> str | None:
    """One warning line when at least ``TIMEOUT_WARN_FRACTION`` of ``episodes`` were cut off at
    their deadline (returned too; None when fewer were)."""
    fraction = timeout_fraction(episodes)
    if not episodes or fraction < TIMEOUT_WARN_FRACTION:
        return None
    cut = round(fraction * len(episodes))
    limit = "no deadline" if deadline_s is None else f"rollout.deadline_s={deadline_s:g} s of being stalled"
    line = (
        f"{where}: {fraction:.0%} of rollouts ({cut}/{len(episodes)}) were cut off at their deadline "
        f"({limit}); they count as failures (reward 0): raise rollout.deadline_s, or lower "
        f"rollout.concurrency or the sampling length if the sampler is overloaded"
    )
    log.warning(line)
    return line


def episode_reward(episode: Episode) -> float:
    """The evaluator's reward for the episode (mean over its rewarded trajectories)."""
    if "reward" in episode.metrics:
        return episode.metrics["reward"]
    rewards = [t.reward for t in episode.trajectories if t.reward is not None]
    return statistics.fmean(rewards) if rewards else 0.0


def episode_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """Rewards, terminations, response lengths and rollout health of a batch of episodes (a
    training step's, or validation's under ``val/``)."""
    if not episodes:
        return {"reward/mean": 0.0, "episodes": 0, "rollout/timeout_frac": 0.0}
    rewards = [episode_reward(e) for e in episodes]
    out: dict[str, float] = {
        "reward/mean": statistics.fmean(rewards),
        "reward/max": max(rewards),
        "reward/min": min(rewards),
        # Each task's mean, averaged: the draw's weights left out (rollout.curriculum draws some
        # tasks more often, dynamic sampling adds groups), so runs that draw differently compare.
        "reward/task_mean": statistics.fmean(statistics.fmean(r) for r in _by_task(episodes, rewards)),
        "correct/fraction": statistics.fmean(1.0 if e.is_correct else 0.0 for e in episodes),
        "episodes": len(episodes),
        # Always present (0 when none), so a curve shows when the deadline starts to bite.
        "rollout/timeout_frac": timeout_fraction(episodes),
    }
    for reason in {e.termination_reason for e in episodes}:
        out[f"termination/{reason}"] = sum(e.termination_reason == reason for e in episodes) / len(episodes)
    response_tokens = [
        len(s.completion_ids)
        for e in episodes
        for t in e.trajectories
        for s in t.steps
        if s.completion_ids is not None
    ]
    if response_tokens:
        out["tokens/response_mean"] = statistics.fmean(response_tokens)
    # How late the rollouts' event loops ran (rllm.engine.rollout.loop_lag): high means CPU-bound.
    out["time/loop_lag_max_s"] = max(e.metrics.get("loop_lag_s", 0.0) for e in episodes)
    # Rollouts whose flow worker (process, Ray actor or node) died under them and ran again.
    out["rollout/worker_lost"] = sum(e.metrics.get("worker_lost", 0.0) for e in episodes)
    out.update(sandbox_step_metrics(episodes))  # sandbox acquire latency, overall and per worker
    # Evaluator signals (e.g. rllm.sdk.v1's "v1/winner_correct"): mean over the episodes reporting them.
    signals: dict[str, list[float]] = {}
    for e in episodes:
        for name, value in e.metrics.items():
            if name.startswith("signal/"):
                signals.setdefault(name, []).append(value)
    out.update({name: statistics.fmean(values) for name, values in signals.items()})
    return out


def _by_task(episodes: Sequence[Episode], rewards: Sequence[float]) -> list[list[float]]:
    by_task: dict[str, list[float]] = {}
    for episode, reward in zip(episodes, rewards, strict=True):
        by_task.setdefault(episode.task_id, []).append(reward)
    return list(by_task.values())
