"""The backend-agnostic training loop.

    tasks (seeded order) -> RolloutEngine (n per task, through the gateway) -> group, filter,
    advantages (rllm.algos) -> TrainSequences -> backend.train_step -> backend.sync_weights ->
    gateway weight version -> validation / checkpoint every k steps

Scheduling, grouping, advantages, filtering, logging, validation and checkpoint cadence live
here once; a backend only trains, syncs and saves.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from rllm.algos import compute_advantages, filter_groups, group_trajectories
from rllm.engine.backend import Backend
from rllm.engine.checkpoint import TrainerState, latest_checkpoint, load_trainer_state, save_checkpoint
from rllm.engine.data_order import next_batch
from rllm.engine.metrics_log import (
    MetricsLogger,
    plot_reward_curve,
    truncate_history,
    write_episode_sample,
)
from rllm.engine.mismatch import check_mismatch, measure_mismatch
from rllm.engine.rollout_engine import RolloutEngine
from rllm.engine.sequences import sequences_from_groups
from rllm.engine.train_progress import TrainProgress
from rllm.engine.trainer_config import TrainerConfig
from rllm.gateway import GatewayConfig
from rllm.sdk.cookbook import Cookbook
from rllm.types import ConfigError, Episode, Task

log = logging.getLogger(__name__)


class TrainResult(msgspec.Struct, kw_only=True):
    steps: int
    out_dir: str
    first_reward: float | None
    final_reward: float | None
    wall_s: float
    plot: str | None = None


class Trainer:
    """Runs one training job: a cookbook's flow and evaluator, a backend, a TrainerConfig."""

    def __init__(self, config: TrainerConfig, cookbook: Cookbook, backend: Backend) -> None:
        self.config = config
        self.cookbook = cookbook
        self.backend = backend
        self.out_dir = Path(config.out_dir)
        validate_algorithm(config, backend)
        self.train_tasks = cookbook.load_tasks(config.train_split)
        self.val_tasks = self._load_val_tasks()

    def _load_val_tasks(self) -> list[Task]:
        if not self.config.val_split:
            return []
        tasks = self.cookbook.load_tasks(self.config.val_split)
        return tasks[: self.config.val_tasks] if self.config.val_tasks else tasks

    async def fit(self, resume: bool = False) -> TrainResult:
        """Train for ``total_steps`` optimizer steps (continuing from the latest checkpoint on resume)."""
        cfg = self.config
        started = time.perf_counter()
        state = TrainerState()
        await self.backend.start()
        engine: RolloutEngine | None = None
        try:
            engine = RolloutEngine(
                self.cookbook.flow,
                self.cookbook.evaluator,
                cfg.engine_rollout(self.backend.served_model_name()),
                gateway_config=self._gateway_config(),
            )
            await engine.start()
            if resume and (ckpt := latest_checkpoint(self.out_dir)) is not None:
                state = load_trainer_state(ckpt)
                state.restore_rng()
                await self.backend.load_checkpoint(ckpt / "backend")
                state.weight_version = await self.backend.sync_weights()
                log.info("resumed from %s at step %d", ckpt, state.step)
            # One history per run: rows and samples past the restored step are redone, not kept twice.
            truncate_history(self.out_dir, state.step)
            await engine.client.set_weight_version(state.weight_version)
            rewards = await self._loop(engine, state)
        finally:
            if engine is not None:
                await engine.close()
            await self.backend.close()
        plot = (
            plot_reward_curve(self.out_dir / "metrics.jsonl", self.out_dir / "reward.png")
            if cfg.plot
            else None
        )
        return TrainResult(
            steps=state.step,
            out_dir=str(self.out_dir),
            first_reward=rewards[0] if rewards else None,
            final_reward=rewards[-1] if rewards else None,
            wall_s=time.perf_counter() - started,
            plot=str(plot) if plot else None,
        )

    async def _loop(self, engine: RolloutEngine, state: TrainerState) -> list[float]:
        cfg = self.config
        rewards: list[float] = []
        metrics_log = MetricsLogger(
            self.out_dir, tensorboard=cfg.tensorboard, wandb=cfg.wandb, config=msgspec.to_builtins(cfg)
        )
        validating = bool(self.val_tasks and cfg.val_every)
        try:
            with TrainProgress(cfg.total_steps, start=state.step, enabled=cfg.progress) as progress:
                if validating and state.step == 0:
                    metrics_log.log(0, await self._validate(engine))
                while state.step < cfg.total_steps:
                    metrics = await self._train_one_step(engine, state)
                    rewards.append(metrics["reward/mean"])
                    if validating and state.step % cfg.val_every == 0:
                        metrics.update(await self._validate(engine))
                    metrics_log.log(state.step, metrics)
                    progress.update(state.step, metrics)
                    if cfg.ckpt_every and state.step % cfg.ckpt_every == 0:
                        await save_checkpoint(self.out_dir, state, self.backend.save_checkpoint)
        finally:
            metrics_log.close()
        return rewards

    async def _train_one_step(self, engine: RolloutEngine, state: TrainerState) -> dict[str, Any]:
        cfg, algo = self.config, self.config.algorithm
        tasks, state.data = next_batch(self.train_tasks, cfg.tasks_per_step, cfg.seed, state.data)
        t0 = time.perf_counter()
        episodes = await engine.run(tasks, n=cfg.group_size)
        t1 = time.perf_counter()
        groups = group_trajectories(episodes, algo)
        kept, filter_metrics = filter_groups(groups, algo)
        advantage_metrics = compute_advantages(kept, algo)
        sequences = sequences_from_groups(kept)
        train_metrics: dict[str, float] = {}
        if sequences:
            train_metrics = await self.backend.train_step(sequences, algo)
        # Token truth: trainer vs sampler logprobs onto the steps (the samples show them), then enforced.
        mismatch = measure_mismatch(sequences, episodes)
        if cfg.sample_groups:
            trained = [t.id for g in kept for t in g.trajectories]
            write_episode_sample(self.out_dir, state.step + 1, episodes, trained, cfg.sample_groups)
        if sequences:
            check_mismatch(mismatch, algo.max_mismatch, state.step + 1, self.backend.name)
            # No request may see half-synced weights: drain the gateway while the sampler swaps them.
            await engine.client.pause()
            try:
                state.weight_version = await self.backend.sync_weights()
                await engine.client.set_weight_version(state.weight_version)
                # Remote services serve each synced checkpoint under its own model name.
                engine.config.model = self.backend.served_model_name()
            finally:
                await engine.client.resume()
        t2 = time.perf_counter()
        state.step += 1
        return {
            **episode_metrics(episodes),
            **{f"filter/{k}": v for k, v in filter_metrics.items()},
            **{f"advantage/{k}": v for k, v in advantage_metrics.items()},
            **{f"train/{k}": v for k, v in train_metrics.items()},
            **mismatch.metrics,
            "train/sequences": len(sequences),
            "weight_version": state.weight_version,
            "time/rollout_s": t1 - t0,
            "time/train_s": t2 - t1,
            "batch/task_ids": [t.id for t in tasks],
        }

    async def _validate(self, engine: RolloutEngine) -> dict[str, float]:
        episodes = await engine.run(self.val_tasks, n=1, is_validation=True)
        return {f"val/{k}": v for k, v in episode_metrics(episodes).items()}

    def _gateway_config(self) -> GatewayConfig:
        cfg = self.config.gateway
        tokenizer = self.backend.tokenizer_path() if cfg.mode == "cumulative" else None
        mode = cfg.mode if tokenizer else "plain"
        # No auto-created sessions: a flow still running past its deadline gets a fast 410 (its session ended).
        return GatewayConfig(
            upstreams=self.backend.inference_urls(),
            store=cfg.store,
            tokenizer_mode=mode,
            tokenizer_path=tokenizer,
            auto_create_sessions=False,
            health_interval_s=1.0,
        )


def episode_reward(episode: Episode) -> float:
    """The evaluator's reward for the episode (mean over its rewarded trajectories)."""
    if "reward" in episode.metrics:
        return episode.metrics["reward"]
    rewards = [t.reward for t in episode.trajectories if t.reward is not None]
    return statistics.fmean(rewards) if rewards else 0.0


def episode_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
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
    # How late the rollouts' event loops ran (rllm.engine.loop_lag): high means CPU-bound.
    out["time/loop_lag_max_s"] = max(e.metrics.get("loop_lag_s", 0.0) for e in episodes)
    # Evaluator signals (e.g. rllm.sdk.v1's "v1/winner_correct"): mean over the episodes reporting them.
    signals: dict[str, list[float]] = {}
    for e in episodes:
        for name, value in e.metrics.items():
            if name.startswith("signal/"):
                signals.setdefault(name, []).append(value)
    out.update({name: statistics.fmean(values) for name, values in signals.items()})
    return out


def validate_algorithm(config: TrainerConfig, backend: Backend) -> None:
    """Refuse, before anything starts, every algorithm option the backend cannot honour."""
    try:
        backend.validate(config.algorithm)
    except ValueError as exc:
        raise ConfigError(
            f"backend {config.backend.name!r} cannot run this algorithm config: {exc}"
        ) from None
