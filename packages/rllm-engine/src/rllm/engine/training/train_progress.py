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

REWARD = ("reward", "reward/mean", "val/reward/mean")  # (label, metric, held-out metric): RL
LOSS = ("loss", "train/loss", "val/loss")  # supervised fine-tuning


class TrainProgress:
    """Shows step, the run's figure (``shown``: the reward for RL, the loss for SFT) and timing;
    plain lines when stderr is not a TTY: the first step's (so a run says it is under way at
    once), then about 10 per run."""

    def __init__(
        self, total_steps: int, start: int = 0, enabled: bool = True, shown: tuple[str, str, str] = REWARD
    ) -> None:
        self.enabled = enabled
        self.total = total_steps
        self.start = start
        self.label, self.key, self.val_key = shown
        self._every = max(1, total_steps // 10)
        self._bar: Progress | None = None
        if enabled and sys.stderr.isatty():
            self._bar = Progress(
                TextColumn("[bold]train"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn(self.label + " {task.fields[figure]}"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
            )
            self._task = self._bar.add_task("train", total=total_steps, completed=start, figure="-")

    def __enter__(self) -> TrainProgress:
        if self._bar is not None:
            self._bar.start()
        return self

    def update(self, step: int, metrics: dict[str, Any]) -> None:
        value = metrics.get(self.key)
        figure = f"{value:.3f}" if isinstance(value, (int, float)) else "-"
        if self._bar is not None:
            self._bar.update(self._task, completed=step, figure=figure)
        elif self.enabled and (step == self.start + 1 or step % self._every == 0 or step == self.total):
            seconds = metrics.get("time/rollout_s", 0.0) + metrics.get("time/train_s", 0.0)
            val = f"  val {metrics[self.val_key]:.3f}" if self.val_key in metrics else ""
            print(
                f"step {step}/{self.total}  {self.label} {figure}{val}  {seconds:.2f} s/step",
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
