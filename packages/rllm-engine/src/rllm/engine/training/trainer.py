"""The backend-agnostic training loop.

    tasks (seeded order) -> RolloutEngine (n per task, through the gateway) -> group, filter,
    advantages (rllm.algos) -> TrainSequences -> backend.train_step -> backend.sync_weights ->
    gateway weight version -> validation -> health checks -> checkpoint every k steps

Scheduling, grouping, advantages, filtering, logging, validation and checkpoint cadence live
here once; a backend only trains, syncs and saves.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from rllm.engine.backend import Backend
from rllm.engine.data.distill_launch import build_distiller
from rllm.engine.rollout.early_flow_processes import EarlyFlowProcesses, start_early_for
from rllm.engine.rollout.rollout_engine import RolloutEngine
from rllm.engine.training.async_loop import AsyncStepper
from rllm.engine.training.checkpoint import TrainerState, load_trainer_state, removed_line, save_checkpoint
from rllm.engine.training.data_order import DataCursor
from rllm.engine.training.dynamic_sampling import CapWatch, fill_step, first_round, signal_rate
from rllm.engine.training.health import Firing, HealthMonitor
from rllm.engine.training.init_from import init_weights, resolve_init_checkpoint
from rllm.engine.training.learning_watch import reward_still_rising
from rllm.engine.training.metrics_log import MetricsLogger, plot_reward_curve, truncate_history
from rllm.engine.training.policies import gateway_routes, publish_policy_models, use_policies
from rllm.engine.training.prefetch import Prefetched, prefetch_allowed
from rllm.engine.training.seeding import seed_process, step_sampling
from rllm.engine.training.staleness import check_backend
from rllm.engine.training.task_repeats import repeats_note
from rllm.engine.training.task_sampler import sampler_for
from rllm.engine.training.train_folder import begin_train_folder
from rllm.engine.training.train_progress import TrainProgress
from rllm.engine.training.train_step import TrainStep, episode_metrics, warn_cut_off
from rllm.engine.training.trainer_config import TrainerConfig
from rllm.gateway import GatewayConfig
from rllm.sdk.cookbook import Cookbook
from rllm.types import ConfigError, Episode, Task
from rllm.types.errors import StateError

log = logging.getLogger(__name__)


class TrainResult(msgspec.Struct, kw_only=True):
    steps: int
    out_dir: str
    first_reward: float | None
    final_reward: float | None
    wall_s: float
    plot: str | None = None
    checkpoint: str | None = None  # the last checkpoint written (the run's final state)
    warnings: list[str] = msgspec.field(default_factory=list)  # what the run's summary must repeat


class Trainer:
    """Runs one training job: a cookbook's flow and evaluator, a backend, a TrainerConfig."""

    def __init__(self, config: TrainerConfig, cookbook: Cookbook, backend: Backend) -> None:
        self.config = config
        self.cookbook = cookbook
        self.backend = backend
        self.out_dir = Path(config.out_dir)
        validate_algorithm(config, backend)
        self.init_checkpoint = resolve_init_checkpoint(config.init_from) if config.init_from else None
        self.distiller = build_distiller(config, backend)
        # The train split's tasks and their draw (the seeded order, or rollout.curriculum's).
        self.sampler = sampler_for(config, cookbook)
        self.val_tasks = load_val_tasks(config, cookbook)
        # Flow processes started before fit (build_trainer, while it builds the tiny model); fit adopts them.
        self.early_workers: EarlyFlowProcesses | None = None

    @property
    def train_tasks(self) -> list[Task]:
        """The tasks the run draws from (at its current difficulty level, with promotion)."""
        return self.sampler.tasks

    async def fit(
        self, resume: bool = False, overwrite: bool = False, allow_changes: Any = ()
    ) -> TrainResult:
        """Train for ``total_steps`` optimizer steps (from the latest checkpoint on ``resume``), under
        the run folder's contract (:mod:`rllm.engine.training.run_folder`; ``allow_changes``: keys
        that may differ from the record). The run always ends with a checkpoint of its last step."""
        cfg = self.config
        started = time.perf_counter()
        ckpt = begin_train_folder(
            cfg, self.cookbook, resume=resume, overwrite=overwrite, allow_changes=allow_changes
        )
        state = TrainerState()
        self.warnings: list[str] = []
        note = repeats_note(cfg.tasks_per_step, len(self.sampler.tasks), cfg.train_split, cfg.group_size)
        if note is not None:
            _say(None, note)
        self.train_step = TrainStep(cfg, self.backend, self.out_dir, distiller=self.distiller)
        self.interrupt_reported = False  # Ctrl-C: its one line is printed (the CLI adds none)
        self.last_checkpoint: Path | None = None
        self._prefetch: Prefetched | None = None  # the next step's rollouts, started early
        self._prefetch_renames = False  # the backend renames its model at each sync: no prefetch
        self._progress: TrainProgress | None = None
        # Flow processes start now, importing while the backend loads the model; the engine adopts them.
        early, self.early_workers = self.early_workers or start_early_for(cfg, self.cookbook), None
        await start_backend(self.backend, cfg, early)
        engine: RolloutEngine | None = None
        try:
            engine = RolloutEngine(
                self.cookbook.flow,
                self.cookbook.evaluator,
                cfg.engine_rollout(self.backend.served_model_name()),
                gateway_config=gateway_config(cfg, self.backend),
                early_workers=early,
            )
            await engine.start()
            if ckpt is not None:
                state = load_trainer_state(ckpt)
                state.restore_rng()
                self.sampler.restore(state.sampler)
                await self.backend.load_checkpoint(ckpt / "backend")
                state.weight_version = await self.backend.sync_weights()
                log.info("resumed from %s at step %d", ckpt, state.step)
            else:
                seed_process(cfg.seed)
            if ckpt is None and self.init_checkpoint is not None:
                state.weight_version = await init_weights(self.backend, self.init_checkpoint)
            # One history per run: rows and samples past the restored step are redone, not kept twice.
            truncate_history(self.out_dir, state.step)
            await engine.client.set_weight_version(state.weight_version)
            await publish_policy_models(cfg.policies, self.backend, engine.client)  # a resume renames them
            rewards = await self._loop(engine, state)
        finally:
            if engine is not None:
                await engine.close()
            await self.backend.close()
        self.warnings.extend(self.train_step.health.summary())
        # Not while the reward still rises: tasks unrewarded so far may well be learnt later.
        if (summary := self.sampler.outcomes.summary()) is not None and not reward_still_rising(rewards):
            self.warnings.append(summary)
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
            checkpoint=str(self.last_checkpoint) if self.last_checkpoint else None,
            warnings=list(self.warnings),
        )

    async def _loop(self, engine: RolloutEngine, state: TrainerState) -> list[float]:
        cfg = self.config
        rewards: list[float] = []
        metrics_log = MetricsLogger(
            self.out_dir, tensorboard=cfg.tensorboard, wandb=cfg.wandb, config=msgspec.to_builtins(cfg)
        )
        validating = bool(self.val_tasks and cfg.val_every)
        saved_step = state.step  # a resumed run starts from a checkpoint of this step
        health = self.train_step.health
        capped = CapWatch(cfg.algorithm, cfg.tasks_per_step)
        # True while the backend's weights, ``state`` and the metrics rows all stand at
        # ``state.step`` (between steps, and during the next step's rollouts): the only time an
        # interrupted run can be checkpointed truthfully.
        self._between_steps = True
        stepper = self._async_stepper(engine, state)
        try:
            with TrainProgress(cfg.total_steps, start=state.step, enabled=cfg.progress) as progress:
                self._progress = progress
                if validating and state.step == 0:
                    first = await _validate(engine, self.val_tasks)
                    health.observe(0, first)
                    metrics_log.log(0, first)
                while state.step < cfg.total_steps:
                    _stop_if_cancel_requested()
                    if stepper is not None:
                        metrics = await stepper.step()
                    else:
                        metrics = await self._train_one_step(engine, state)
                    rewards.append(metrics["reward/mean"])
                    if validating and state.step % cfg.val_every == 0:
                        metrics.update(await _validate(engine, self.val_tasks))
                    firings = _judge_step(health, capped, progress, state.step, metrics)
                    metrics_log.log(state.step, metrics)
                    if (stop := health.stop_for(firings)) is not None:
                        raise stop  # after the row: `rllm doctor run` and `rllm view` show the step
                    self._between_steps = True
                    progress.update(state.step, metrics)
                    if cfg.ckpt_every and state.step % cfg.ckpt_every == 0:
                        await self._checkpoint(_snapshot(stepper, state))
                        saved_step = state.step
                # A short run (or ckpt_every = 0) must still leave something to resume and serve.
                if state.step != saved_step:
                    await self._checkpoint(_snapshot(stepper, state))
        except (asyncio.CancelledError, KeyboardInterrupt):
            await self._cancel_prefetch()  # nothing runs during the save below
            # Ctrl-C: keep the steps done since the last checkpoint when that is truthful (not in
            # the middle of an update; an asynchronous run trains while it rolls out, so it keeps
            # only its last checkpoint); saving takes what one checkpoint takes, and a second
            # Ctrl-C skips it.
            if self._between_steps and stepper is None and state.step != saved_step:
                print(
                    f"interrupted: saving a checkpoint of step {state.step} (Ctrl-C again to skip)",
                    file=sys.stderr,
                    flush=True,
                )
                self.interrupt_reported = True
                await self._checkpoint(state)
            raise
        finally:
            await self._cancel_prefetch()  # a step that failed between steps leaves none behind
            if stepper is not None:
                await stepper.close()
            metrics_log.close()
            if (summary := capped.summary()) is not None:
                self.warnings.append(summary)
        return rewards

    async def _checkpoint(self, state: TrainerState) -> None:
        # A save cut short by Ctrl-C is still running in its thread: no second save over it.
        between, self._between_steps = self._between_steps, False
        state.sampler = self.sampler.state()
        self.last_checkpoint = await save_checkpoint(
            self.out_dir,
            state,
            self.backend.save_checkpoint,
            keep=self.config.keep_checkpoints,
            removed=lambda path: _say(self._progress, removed_line(path, self.config.keep_checkpoints)),
        )
        self._between_steps = between

    def _async_stepper(self, engine: RolloutEngine, state: TrainerState) -> AsyncStepper | None:
        return async_stepper(self, engine, state)  # a method: a test takes it at K = 0

    async def _train_one_step(self, engine: RolloutEngine, state: TrainerState) -> dict[str, Any]:
        """The synchronous step: this step's rollouts (maybe prefetched), the shared step
        (rllm.engine.training.train_step) and its weight sync, with the next step's rollouts prefetched
        meanwhile where ``rollout.prefetch`` allows."""
        t0 = time.perf_counter()
        # The cursor moves with the step count, at the end: a step cut short is redone whole.
        tasks, next_data, episodes, prefetched, sampled = await self._step_rollouts(engine, state)
        self._between_steps = False  # from here the weights may move ahead of ``state``
        state.signal_rate = signal_rate(sampled)  # sizes the next step's first round
        t1 = time.perf_counter()
        # rollout.prefetch: step N+1's rollouts start now, their calls held at the door until
        # the new weights are in (rllm.engine.training.prefetch).
        holding = await self._start_prefetch(engine, state, next_data)
        try:
            metrics = await self.train_step.run(
                episodes, state.step + 1, lambda: self._publish(engine, state, holding)
            )
        except BaseException:
            await self._cancel_prefetch()  # before the door opens: none of its calls runs
            raise
        finally:
            if holding:
                await engine.client.resume()
        t2 = time.perf_counter()
        state.step += 1
        state.data = next_data
        return {
            **metrics,
            **sampled,
            "weight_version": state.weight_version,
            # Prefetched: the rollouts started during the previous step's training, and
            # time/rollout_s is only what was left of them when this step began.
            "rollout/prefetched": float(prefetched),
            "time/rollout_s": t1 - t0,
            "time/train_s": t2 - t1,
            "batch/task_ids": [t.id for t in tasks],
        }

    async def _publish(self, engine: RolloutEngine, state: TrainerState, holding: bool) -> None:
        """The new weights to the sampler. No request may see half-synced weights: the gateway is
        drained while the sampler swaps them (``holding``: already paused for the prefetch)."""
        if not holding:
            await engine.client.pause()
        try:
            state.weight_version = await self.backend.sync_weights()
            await engine.client.set_weight_version(state.weight_version)
            await publish_policy_models(self.config.policies, self.backend, engine.client)
            await self._rename_model(engine)
        finally:
            if not holding:
                await engine.client.resume()

    async def _step_rollouts(
        self, engine: RolloutEngine, state: TrainerState
    ) -> tuple[list[Task], DataCursor, list[Episode], bool, dict[str, float]]:
        """This step's batch, the cursor after it, its episodes, whether they were prefetched, and
        the metrics of their draw (topped up by ``algorithm.dynamic_sampling``: ``fill_step``)."""
        cfg = self.config
        sampling = step_sampling(engine.config.sampling, state.step + 1)  # this step's own seed
        prefetch, self._prefetch = self._prefetch, None
        if prefetch is not None and prefetch.data == state.data:
            tasks, next_data, prefetched = prefetch.tasks, prefetch.next_data, True
            episodes = await prefetch.rollouts
        else:
            if prefetch is not None:  # started for another cursor: never trained on
                await prefetch.cancel()
            first = first_round(cfg.algorithm, cfg.tasks_per_step, state.signal_rate)
            tasks, next_data = self.sampler.next_batch(first, state.data)
            episodes, prefetched = await engine.run(tasks, n=cfg.group_size, sampling=sampling), False
        drawn = await fill_step(
            self.sampler,
            lambda more, drawings: engine.run(more, n=cfg.group_size, sampling=sampling, drawings=drawings),
            cfg.algorithm,
            (cfg.tasks_per_step, cfg.group_size),
            (tasks, next_data, episodes),
        )
        return (*drawn[:3], prefetched, drawn[3])

    async def _start_prefetch(self, engine: RolloutEngine, state: TrainerState, data: DataCursor) -> bool:
        """Pause the gateway and start the next step's rollouts (``data``: the cursor after this
        step); False, and nothing started, where this step must end with nothing in flight."""
        cfg = self.config
        validating = bool(self.val_tasks and cfg.val_every)
        if (
            not cfg.rollout.prefetch
            or self._prefetch_renames
            or not prefetch_allowed(
                state.step + 1, cfg.total_steps, cfg.val_every, cfg.ckpt_every, validating
            )
        ):
            return False
        # Nothing is in flight (this step's rollouts are all in): the pause holds at once.
        await engine.client.pause()
        first = first_round(cfg.algorithm, cfg.tasks_per_step, state.signal_rate)
        tasks, next_data = self.sampler.next_batch(first, data)
        sampling = step_sampling(engine.config.sampling, state.step + 2)  # the step after this one
        rollouts = asyncio.create_task(engine.run(tasks, n=cfg.group_size, sampling=sampling))
        self._prefetch = Prefetched(data, tasks, next_data, rollouts)
        return True

    async def _cancel_prefetch(self) -> None:
        prefetch, self._prefetch = self._prefetch, None
        if prefetch is not None:
            await prefetch.cancel()

    async def _rename_model(self, engine: RolloutEngine) -> None:
        """Remote services serve each synced checkpoint under its own model name: agents get it
        from now on. Rollouts prefetched under the old name would call the old weights, so they
        are cancelled while their calls still wait at the door, run again after the sync, and
        this run prefetches no more (the name moves at every sync)."""
        name = self.backend.served_model_name()
        if name == engine.config.model:
            return
        engine.config.model = name
        if self._prefetch is not None:
            await self._cancel_prefetch()
            self._prefetch_renames = True
            log.info("rollout.prefetch: the backend renames its model at every sync; not prefetching")


def gateway_config(config: TrainerConfig, backend: Backend) -> GatewayConfig:
    """The run's gateway: in front of the backend's inference servers, cumulative where the
    backend has a tokenizer for it."""
    cfg = config.gateway
    tokenizer = backend.tokenizer_path() if cfg.mode == "cumulative" else None
    if tokenizer and (local := Path(tokenizer).expanduser()).exists():
        # Absolute before it leaves this process: rollout workers (Ray's above all) may start in
        # another folder, where `runs/say/tiny-model` does not exist and would be read as a hub name.
        tokenizer = str(local.resolve())
    mode = cfg.mode if tokenizer else "plain"
    # No auto-created sessions: a flow still running past its deadline gets a fast 410 (its session ended).
    return GatewayConfig(
        upstreams=backend.inference_urls(),
        store=cfg.store,
        tokenizer_mode=mode,
        tokenizer_path=tokenizer,
        auto_create_sessions=False,
        health_interval_s=1.0,
        partial_rollouts=config.rollout.partial,  # a sync aborts and continues calls
        **gateway_routes(config.policies, config.roles, backend),  # several policies: each call to its role's
    )


def async_stepper(trainer: Trainer, engine: RolloutEngine, state: TrainerState) -> AsyncStepper | None:
    """K > 0: the asynchronous step (rllm.engine.training.async_loop); K = 0: the synchronous one."""
    if trainer.config.rollout.max_staleness == 0:
        if state.unconsumed_task_ids:
            raise StateError(
                f"the checkpoint holds {len(state.unconsumed_task_ids)} tasks an asynchronous run "
                "handed out but did not train on; resume with its rollout.max_staleness > 0"
            )
        return None
    return AsyncStepper(trainer, engine, state).start()


def _judge_step(
    health: HealthMonitor, capped: CapWatch, progress: TrainProgress, step: int, metrics: dict[str, Any]
) -> list[Firing]:
    """The step's row judged before it is logged: the health checks (``health/*`` and the lines
    of those that fire) and dynamic sampling's cap; returns the checks that fired."""
    for note in health.take_notes():
        progress.warn(note)
    firings = health.observe(step, metrics)  # writes health/* into the row
    for firing in firings:
        progress.warn(firing.line)
    if (warning := capped.observe(step, metrics)) is not None:
        metrics["warning/dynamic_sampling_capped"] = warning
        progress.warn(warning)
    return firings


def _say(progress: TrainProgress | None, line: str) -> None:
    """A line for the user: above the progress bar while it is drawn, else on stderr."""
    progress.say(line) if progress is not None else print(line, file=sys.stderr, flush=True)


def load_val_tasks(config: TrainerConfig, cookbook: Cookbook) -> list[Task]:
    """The validation tasks (``val_split``, the first ``val_tasks`` of them)."""
    if not config.val_split:
        return []
    tasks = cookbook.load_tasks(config.val_split)
    return tasks[: config.val_tasks] if config.val_tasks else tasks


def validate_algorithm(config: TrainerConfig, backend: Backend) -> None:
    """Refuse, before anything starts, every algorithm option the backend cannot honour."""
    # First: a backend that cannot keep K > 0 is refused for that, by name, not for the
    # correction (algorithm.tis) that K > 0 turned on by default.
    check_backend(backend, config.rollout.max_staleness, config.rollout.partial)
    try:
        backend.validate(config.algorithm)
    except ValueError as exc:
        raise ConfigError(
            f"backend {config.backend.name!r} cannot run this algorithm config: {exc}"
        ) from None
    # Several policies: refused here where the backend cannot train them.
    use_policies(config.policies, config.algorithm, backend)


def _snapshot(stepper: AsyncStepper | None, state: TrainerState) -> TrainerState:
    # Async: rollouts go on during the save; keep the state of this instant.
    return stepper.snapshot() if stepper is not None else state


async def _validate(engine: RolloutEngine, tasks: list[Task]) -> dict[str, float]:
    episodes = await engine.run(tasks, n=1, is_validation=True)
    warn_cut_off(episodes, "validation", engine.config.deadline_s)
    return {f"val/{k}": v for k, v in episode_metrics(episodes).items()}


def _stop_if_cancel_requested() -> None:
    """Raise CancelledError when this task was asked to stop (Ctrl-C cancels the main task) but
    the request was swallowed on the way, as Python 3.11's ``asyncio.wait_for`` can do when the
    awaited call finishes in the same loop turn: the run then stops at the next step instead of
    running to its end and exiting 0."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def start_backend(backend: Backend, cfg: TrainerConfig, early: EarlyFlowProcesses | None) -> None:
    """The backend started and the run's memory checked before any rollout; on a failure the
    early flow workers (and the backend, once started) are closed before it stands."""
    try:
        await backend.start()
    except BaseException:
        if early is not None:
            early.close()
        raise
    try:
        await check_memory_at_start(backend, cfg)
    except BaseException:
        if early is not None:
            early.close()
        await backend.close()
        raise


async def check_memory_at_start(backend: Backend, cfg: TrainerConfig) -> None:
    """Before the first rollout, a backend that plans its training memory (the local tinker
    trainer: ``check_step_memory``) plans a step of the run's shape: ``tasks_per_step *
    group_size`` sequences of ``rollout.sampling.max_tokens`` + 1 tokens (the least a rollout
    trains; None: the backend's own default), and refuses one that cannot fit now, not after the
    first rollouts. The first step plans again from its real rows."""
    check = getattr(backend, "check_step_memory", None)
    if check is None:
        return
    sampling = cfg.rollout.sampling
    max_tokens = sampling.max_tokens if sampling is not None else None
    line = await check(cfg.tasks_per_step * cfg.group_size, max_tokens, cfg.algorithm)
    if line:
        log.info("before the first rollout: %s", line)
