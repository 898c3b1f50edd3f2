"""Run metrics: JSONL (always), TensorBoard and W&B (when installed and enabled), a reward plot,
and a compact per-step sample of episodes (msgpack, ``OUT/samples/``) for ``rllm view``.

One history per run: a resumed run first cuts ``metrics.jsonl`` and the samples back to the
restored checkpoint (``truncate_history``), so steps redone after a crash appear once.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec

from rllm.engine.training.tb_events import ScalarEventFile, open_scalar_events
from rllm.types import Episode, from_msgpack, to_msgpack
from rllm.types.errors import InputError
from rllm.types.images import pack_episode_images

log = logging.getLogger(__name__)

SAMPLES_DIR = "samples"
DROPPED_METRICS = "metrics.dropped.jsonl"


class EpisodeSample(msgspec.Struct, kw_only=True):
    """Some groups of one training step: their episodes (advantages already written on the
    steps) and which trajectories the step trained on (the rest were filtered out)."""

    step: int
    episodes: list[Episode]
    trained_trajectory_ids: list[str] = msgspec.field(default_factory=list)


class MetricsLogger:
    """Writes one JSON line per step to ``OUT/metrics.jsonl`` and mirrors scalars to the sinks."""

    def __init__(
        self, out_dir: Path, *, tensorboard: bool = True, wandb: bool = False, config: Any = None
    ) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        self.path = out_dir / "metrics.jsonl"
        self._file = self.path.open("a", buffering=1)
        self._tb: ScalarEventFile | None = None
        self._wandb = _wandb_run(out_dir, config) if wandb else None
        # The sinks (TensorBoard: ~0.5 ms a step, mostly its pure-Python CRC; wandb) run on one
        # thread, in order, off the step's path (benchmarks/whole_system.py).
        # metrics.jsonl (what resume and `rllm view` read) stays written here, synchronously.
        self._sinks = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="rllm-metrics")
            if tensorboard or self._wandb is not None
            else None
        )
        self._pending: list[Future[None]] = []
        if tensorboard and self._sinks is not None:
            # Importing tensorboard takes ~0.9 s of CPU: on the sink thread, the first job, it
            # overlaps the first step instead of delaying it (benchmarks/cli_startup.py).
            self._pending.append(self._sinks.submit(self._open_tensorboard, out_dir / "tensorboard"))

    def _open_tensorboard(self, path: Path) -> None:
        self._tb = _tensorboard_writer(path)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        self._file.write(json.dumps({"step": step, **metrics}) + "\n")
        if self._sinks is None:
            return
        self._raise_sink_errors(wait=False)
        scalars = {
            k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)
        }
        self._pending.append(self._sinks.submit(self._mirror, step, scalars, time.time()))

    def _mirror(self, step: int, scalars: dict[str, float], wall_time: float) -> None:
        if self._tb is not None:
            # One Event per step; on disk within a few seconds (tb_events.FLUSH_SECS) and at close.
            self._tb.add_scalars(step, scalars, wall_time)
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)

    def _raise_sink_errors(self, wait: bool) -> None:
        """A sink that failed fails the run loudly (at the next step, or at close)."""
        pending, self._pending = self._pending, []
        for future in pending:
            if wait or future.done():
                future.result()
            else:
                self._pending.append(future)

    def close(self) -> None:
        self._file.close()
        try:
            if self._sinks is not None:
                self._raise_sink_errors(wait=True)
        finally:
            if self._sinks is not None:
                self._sinks.shutdown(wait=True)
            if self._tb is not None:
                self._tb.close()
            if self._wandb is not None:
                self._wandb.finish()


def sample_path(out_dir: Path, step: int) -> Path:
    return out_dir / SAMPLES_DIR / f"step_{step:06d}.msgpack"


def write_episode_sample(
    out_dir: Path, step: int, episodes: Iterable[Episode], trained_trajectory_ids: Iterable[str], groups: int
) -> Path | None:
    """Keep every rollout of the step's best and worst group (by mean episode reward) and of its
    first tasks, up to ``groups`` groups (at least those two); None if ``groups`` is 0.

    The best group is kept even when it is not among the first: a step whose only successful
    episode falls elsewhere would otherwise have nothing worth looking at.
    """
    episodes = list(episodes)
    if groups <= 0:
        return None
    task_ids = list(dict.fromkeys(e.task_id for e in episodes))
    mean = {tid: _mean_reward([e for e in episodes if e.task_id == tid]) for tid in task_ids}
    if not task_ids:
        return None
    best, worst = max(task_ids, key=mean.__getitem__), min(task_ids, key=mean.__getitem__)  # ties: first
    keep = list(dict.fromkeys([best, worst, *task_ids]))
    keep = keep[: max(groups, 2)]
    chosen = [e for e in episodes if e.task_id in set(keep)]
    kept = {t.id for e in chosen for t in e.trajectories}
    sample = EpisodeSample(
        step=step,
        episodes=[pack_episode_images(e) for e in chosen],  # each image once per episode
        trained_trajectory_ids=[t for t in trained_trajectory_ids if t in kept],
    )
    path = sample_path(out_dir, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(to_msgpack(sample))
    os.replace(tmp, path)  # a reader never sees half a sample
    return path


def _mean_reward(episodes: list[Episode]) -> float:
    rewards = [float(e.metrics.get("reward", 0.0)) for e in episodes]
    return sum(rewards) / len(rewards) if rewards else 0.0


def read_episode_sample(path: Path) -> EpisodeSample:
    return from_msgpack(path.read_bytes(), EpisodeSample)


def sample_steps(out_dir: Path) -> list[int]:
    """The steps that have an episode sample, ascending."""
    root = out_dir / SAMPLES_DIR
    if not root.is_dir():
        return []
    return sorted(int(p.stem.removeprefix("step_")) for p in root.glob("step_*.msgpack"))


def truncate_history(out_dir: Path, last_step: int) -> int:
    """Cut the run's history back to ``last_step`` (the restored checkpoint; 0 for a fresh start).

    Rows and samples of later steps belong to a history the resumed run is about to redo: the
    rows move to ``metrics.dropped.jsonl`` (kept for post-mortems, never plotted), the samples
    are deleted. With ``last_step == 0`` the step-0 validation row goes too (it is redone).
    Returns the number of rows moved."""
    path = out_dir / "metrics.jsonl"
    rows = read_metrics(path)

    def kept(step: int) -> bool:
        return last_step > 0 and step <= last_step

    keep = [r for r in rows if kept(r.get("step", 0))]
    dropped = [r for r in rows if not kept(r.get("step", 0))]
    if dropped:
        with (out_dir / DROPPED_METRICS).open("a") as f:
            f.writelines(json.dumps({**r, "dropped_on_resume_from": last_step}) + "\n" for r in dropped)
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in keep))
        os.replace(tmp, path)
        log.warning(
            "starting at step %d: moved %d later metric rows to %s", last_step, len(dropped), DROPPED_METRICS
        )
    for step in sample_steps(out_dir):
        if not kept(step):
            sample_path(out_dir, step).unlink(missing_ok=True)
    return len(dropped)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Every row; a torn last line (a run killed mid-write) is left out."""
    if not path.is_file():
        return []
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    rows = []
    for number, line in enumerate(lines, start=1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if number != len(lines):
                raise InputError(f"{path}:{number}: not a JSON metrics row") from None
    return rows


PLOT_SERIES = {"reward/mean": "train reward (sampled)", "val/reward/mean": "validation reward"}


def plot_reward_curve(
    metrics_path: Path, png_path: Path, series: dict[str, str] = PLOT_SERIES
) -> Path | None:
    """Draw reward against step for the keys present; None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.info("matplotlib is not installed; skipping the reward plot (pip install 'rllm-engine[plot]')")
        return None
    rows = read_metrics(metrics_path)
    fig, ax = plt.subplots(figsize=(7, 4))
    for key, label in series.items():
        points = [(r["step"], r[key]) for r in rows if key in r]
        if points:
            ax.plot(*zip(*points, strict=True), label=label, marker="." if len(points) < 60 else None)
    ax.set_title(f"{metrics_path.parent.name}: reward per step")
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.set_ylim(-0.05, 1.05)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
    return png_path


def _tensorboard_writer(path: Path) -> ScalarEventFile | None:
    writer = open_scalar_events(path)
    if writer is None:
        log.info("tensorboard is not installed; metrics go to JSONL only")
    return writer


def _wandb_run(out_dir: Path, config: Any) -> Any:
    try:
        import wandb  # pyright: ignore[reportMissingImports]  # optional extra, absent from the dev env
    except ImportError:
        log.warning("wandb=true but wandb is not installed; skipping W&B")
        return None
    return wandb.init(dir=str(out_dir), config=config)
