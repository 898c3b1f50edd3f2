"""Training failures injected into real tiny-model runs, for the health checks to name
(tests/test_health_e2e.py) and for benchmarks/health_overhead.py to time.

Each ``Failure`` is a real `rllm train` run (the tinker backend's local service, the gateway, the
two-turn ``say`` flow: the README main job's shape, its flows in-process) with one thing wrong,
and the check that must name it:

- ``stale_sampler``: the backend's weight sync bumps the version but never loads the new weights
  into the sampler (``SamplerNeverLoadsWeights``, a test double of the sync step): the verl #7495
  class. -> ``weights_stale``
- ``lr_zero``: the optimizer's learning-rate schedule sits at 0 (``LearningRateAtZero``, a test
  double of a schedule: the local service's own LR scale set to 0). -> ``lr_zero``
- ``length_reward``: an evaluator that pays for length, with room to grow (max_tokens 128, where
  the fresh tiny model ends most replies before the limit: about 16% cut at step 1, 70-90% from
  step 10 on). -> ``length_blowup``
- ``half_no_variance``: half the tasks are paid 0.5 whatever the model says (every two steps
  cover the 64 tasks once, so a 4-step window holds exactly half). -> ``no_signal``
- ``val_falls``: an evaluator that pays the word on training tasks and anything but the word on
  the held-out ones, so validation falls while train reward rises. -> ``reward_hacking``

``HEALTHY`` is the same small run with nothing wrong: nothing may fire.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rllm_cookbook_say import load_tasks, say_evaluator, say_flow, starts_with_word

from rllm.engine.training.launch import build_trainer
from rllm.engine.training.metrics_log import read_metrics
from rllm.engine.training.trainer import Trainer
from rllm.sdk.cookbook import Cookbook
from rllm.sdk.evaluator import evaluator
from rllm.types import Episode, EvalOutput, Task

# The README main job (`rllm train say`: its train_defaults) with one flow worker (in-process,
# so every run with the same seed samples alike), shorter, no checkpoints but the final one.
BASE = [
    "tasks_per_step=32",
    "group_size=4",
    "backend.options.learning_rate=5e-4",
    "algorithm.step_credit=turn",
    "algorithm.gamma=0.0",
    "val_every=0",
    "ckpt_every=0",
    "rollout.workers=1",
    "rollout.sampling.max_tokens=2",
    "progress=false",
    "plot=false",
    "tensorboard=false",
    "sample_groups=1",
    "health.window=4",
]


class SamplerNeverLoadsWeights:
    """A test double of the weight sync: it bumps the sampler's weight version (so every trace
    claims the new weights) without copying them, as a sync that silently keeps serving the
    initial policy does. Everything else is the real backend."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def sync_weights(self) -> int:
        engine = self.inner.service.engine
        return await asyncio.to_thread(engine.update_weights, lambda: None)


class LearningRateAtZero:
    """A test double of a learning-rate schedule stuck at 0: once started, the local service's
    learning-rate scale (what `rllm sft`'s schedule sets) is 0. Everything else is the real backend."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def start(self) -> None:
        await self.inner.start()
        self.inner.set_learning_rate_scale(0.0)


LENGTH_MAX_TOKENS = 128


@evaluator
def pays_for_length(task: Task, episode: Episode) -> EvalOutput:
    """Reward = the replies' share of max_tokens (one word-level token a word)."""
    replies = [str(r) for r in episode.artifacts.get("replies") or []]
    words = sum(len(r.split()) for r in replies)
    return EvalOutput(reward=min(1.0, words / (LENGTH_MAX_TOKENS * max(1, len(replies)))))


@evaluator
def half_fixed(task: Task, episode: Episode) -> EvalOutput:
    """Every rollout of an even-numbered task is paid 0.5, whatever it says; the others as say."""
    if int(task.metadata["index"]) % 2 == 0:
        return EvalOutput(reward=0.5)
    return say_evaluator(task, episode)


@evaluator
def held_out_inverted(task: Task, episode: Episode) -> EvalOutput:
    """Training tasks pay the words, as say does; held-out (test) tasks pay the turns that miss."""
    if not task.metadata.get("held_out"):
        return say_evaluator(task, episode)
    replies = [str(r) for r in episode.artifacts.get("replies") or []]
    words = task.metadata["words"]
    misses = [not starts_with_word(r, w) for r, w in zip(replies, words, strict=False)]
    return EvalOutput(reward=sum(misses) / len(words))


def indexed_tasks(split: str) -> list[Task]:
    """say's two-turn tasks with their index (and ``held_out`` on the test split)."""
    tasks = load_tasks(split)
    for i, task in enumerate(tasks):
        task.metadata = {**task.metadata, "index": i, "held_out": split == "test"}
    return tasks


def cookbook(name: str, evaluate: Any) -> Cookbook:
    return Cookbook(name=name, flow=say_flow, evaluator=evaluate, load_tasks=indexed_tasks)


@dataclass
class Failure:
    """One injected failure: its run's settings and the check that must name it within ``bound`` steps."""

    name: str
    check: str | None  # None: the healthy run, where nothing may fire
    bound: int  # steps the run is given (the check must fire by then)
    evaluate: Any = say_evaluator
    overrides: list[str] = field(default_factory=list)
    wrap: Callable[[Any], Any] | None = None


FAILURES: dict[str, Failure] = {
    f.name: f
    for f in [
        Failure("stale_sampler", "weights_stale", 6, wrap=SamplerNeverLoadsWeights),
        Failure("lr_zero", "lr_zero", 6, wrap=LearningRateAtZero),
        Failure(
            "length_reward",
            "length_blowup",
            20,
            pays_for_length,
            # 16 rollouts a step; the first step's long replies on a cold, busy machine can take
            # minutes (133 s on one at load 14), past the trainer's 120 s rollout deadline.
            [
                "tasks_per_step=4",
                "group_size=4",
                f"rollout.sampling.max_tokens={LENGTH_MAX_TOKENS}",
                "rollout.deadline_s=900",
            ],
        ),
        Failure("half_no_variance", "no_signal", 8, half_fixed),
        Failure("val_falls", "reward_hacking", 80, held_out_inverted, ["val_split=test", "val_every=4"]),
    ]
}
HEALTHY = Failure("healthy", None, 30)


@dataclass
class Outcome:
    fired: dict[str, int]  # check -> the step it first fired
    steps: int  # steps the run trained
    rows: list[dict[str, Any]]
    stopped: str | None  # the HealthStop line, when stop_on stopped it


def build(failure: Failure, out: Path, *, stop: bool = True, extra: list[str] = ()) -> Trainer:
    """The run's Trainer (not started); with ``stop``, ``health.stop_on`` names the failure's check."""
    overrides = [*BASE, f"total_steps={failure.bound}", *failure.overrides, *extra]
    if stop and failure.check is not None:
        overrides.append(f"health.stop_on=[{failure.check}]")
    trainer = build_trainer(
        "health-" + failure.name,
        cookbook=cookbook("health-" + failure.name, failure.evaluate),
        overrides=overrides,
        out_dir=str(out),
        resume=False,
    )
    if failure.wrap is not None:
        trainer.backend = failure.wrap(trainer.backend)
    return trainer


def run(failure: Failure, out: Path, *, stop: bool = True, extra: list[str] = ()) -> Outcome:
    """Train ``failure``'s run in ``out`` and say what fired when."""
    from rllm.engine.training.health import HealthStop

    trainer = build(failure, out, stop=stop, extra=extra)
    stopped = None
    try:
        asyncio.run(trainer.fit())
    except HealthStop as exc:
        stopped = str(exc)
    rows = read_metrics(out / "metrics.jsonl")
    fired = {
        key.removeprefix("warning/health/"): int(row["step"])
        for row in rows
        for key in row
        if key.startswith("warning/health/")
    }
    steps = max((int(r["step"]) for r in rows), default=0)
    return Outcome(fired=fired, steps=steps, rows=rows, stopped=stopped)
