"""Training progress: a rich bar on a terminal, one plain line every few steps elsewhere."""

from __future__ import annotations

import sys
from typing import Any

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class TrainProgress:
    """Shows step, reward and timing; plain lines (about 10 per run) when stderr is not a TTY."""

    def __init__(self, total_steps: int, start: int = 0, enabled: bool = True) -> None:
        self.enabled = enabled
        self.total = total_steps
        self._every = max(1, total_steps // 10)
        self._bar: Progress | None = None
        if enabled and sys.stderr.isatty():
            self._bar = Progress(
                TextColumn("[bold]train"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("reward {task.fields[reward]:.3f}"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
            )
            self._task = self._bar.add_task("train", total=total_steps, completed=start, reward=0.0)

    def __enter__(self) -> TrainProgress:
        if self._bar is not None:
            self._bar.start()
        return self

    def update(self, step: int, metrics: dict[str, Any]) -> None:
        reward = metrics.get("reward/mean", 0.0)
        if self._bar is not None:
            self._bar.update(self._task, completed=step, reward=reward)
        elif self.enabled and (step % self._every == 0 or step == self.total):
            seconds = metrics.get("time/rollout_s", 0.0) + metrics.get("time/train_s", 0.0)
            val = f"  val {metrics['val/reward/mean']:.3f}" if "val/reward/mean" in metrics else ""
            print(
                f"step {step}/{self.total}  reward {reward:.3f}{val}  {seconds:.2f} s/step",
                file=sys.stderr,
                flush=True,
            )

    def warn(self, message: str) -> None:
        """A warning the user must see, progress display or not (above the bar when there is one)."""
        if self._bar is not None:
            self._bar.console.print(f"[yellow]warning:[/yellow] {message}", highlight=False)
        else:
            print(f"warning: {message}", file=sys.stderr, flush=True)

    def say(self, message: str) -> None:
        """A line of the run's output that is not a warning (a checkpoint removed), shown the same way."""
        if self._bar is not None:
            self._bar.console.print(message, highlight=False, soft_wrap=True)
        else:
            print(message, file=sys.stderr, flush=True)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
