"""One training step, the same in the synchronous and the asynchronous loop.

    finished episodes -> group -> filters -> advantages -> TrainSequences -> distillation ->
    backend.train_step -> train/sampler mismatch measured -> the step's sample written ->
    mismatch checked (algorithm.max_mismatch) -> new weights published -> metrics

The loops differ only around it: where the episodes come from (the synchronous loop,
``rllm.engine.training.trainer``, rolls out one batch, maybe prefetched; the asynchronous one,
``rllm.engine.training.async_loop``, takes finished groups within the staleness bound) and how new weights
reach the sampler (each passes its own ``publish``: a pause, or a held prefetch, around the sync;
a drain under a watchdog). Everything between lives here once, so whatever the step measures or
enforces holds in both modes, as the capability matrix (docs/capabilities.md) promises.

The sample is written before the mismatch is checked (the viewer shows where a stopped run
drifted), and the check comes before ``publish``: weights trained on tokens that were not the
tokens sampled never reach the sampler.
"""

from __future__ import annotations

import statistics
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rllm.algos import compute_advantages, filter_groups, group_trajectories
from rllm.engine.rollout.worker_metrics import sandbox_step_metrics
from rllm.engine.training.learning_watch import UnrewardedTaskWatch
from rllm.engine.training.metrics_log import write_episode_sample
from rllm.engine.training.mismatch import check_mismatch, measure_mismatch
from rllm.engine.training.sequences import sequences_from_groups, signal_sequences
from rllm.types import Episode

if TYPE_CHECKING:
    from rllm.engine.backend import Backend
    from rllm.engine.data.distill import Distiller
    from rllm.engine.training.trainer_config import TrainerConfig

Publish = Callable[[], Awaitable[None]]


class TrainStep:
    """Trains on a batch of finished episodes and publishes the new weights (``run``).

    One per run: ``unrewarded`` counts across its steps (the run's end names the tasks it never
    rewarded)."""

    def __init__(
        self, config: TrainerConfig, backend: Backend, out_dir: Path, *, distiller: Distiller | None = None
    ) -> None:
        self.config, self.backend, self.out_dir = config, backend, out_dir
        self.distiller = distiller
        self.unrewarded = UnrewardedTaskWatch()

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
        groups = group_trajectories(episodes, algo)
        unrewarded_metrics = self.unrewarded.observe(groups)
        kept, filter_metrics = filter_groups(groups, algo)
        advantage_metrics = compute_advantages(kept, algo)
        sequences = sequences_from_groups(kept)
        distill_metrics = await self.distiller.apply(sequences) if self.distiller and sequences else {}
        train_metrics: dict[str, float] = {}
        if sequences:
            train_metrics = await self.backend.train_step(sequences, algo)
        # Token truth: trainer vs sampler logprobs onto the steps (the samples show them), then enforced.
        mismatch = measure_mismatch(sequences, episodes, weight_version)
        if cfg.sample_groups:
            trained = [t.id for g in kept for t in g.trajectories]
            write_episode_sample(self.out_dir, step, episodes, trained, cfg.sample_groups)
        if sequences:
            check_mismatch(mismatch, algo.max_mismatch, step, self.backend.name)
            await publish()
        return {
            **episode_metrics(episodes),
            **{f"filter/{k}": v for k, v in filter_metrics.items()},
            **unrewarded_metrics,
            **{f"advantage/{k}": v for k, v in advantage_metrics.items()},
            **distill_metrics,
            **{f"train/{k}": v for k, v in train_metrics.items()},
            **mismatch.metrics,
            "train/sequences": len(sequences),
            "train/signal_sequences": signal_sequences(sequences),
        }


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
        return {"reward/mean": 0.0, "episodes": 0}
    rewards = [episode_reward(e) for e in episodes]
    out: dict[str, float] = {
        "reward/mean": statistics.fmean(rewards),
        "reward/max": max(rewards),
        "reward/min": min(rewards),
        "correct/fraction": statistics.fmean(1.0 if e.is_correct else 0.0 for e in episodes),
        "episodes": len(episodes),
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
