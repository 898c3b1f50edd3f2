"""A rich progress bar for rollouts: done/total, rollouts/s, success rate, error count and the
event-loop lag of the processes running the flows (see :mod:`rllm.engine.rollout.loop_lag`).

Disabled when stderr is not a terminal (CI logs, files) or when the caller asks, so batch logs
stay clean; the counters are kept either way and end up in the engine's metrics.
"""

from __future__ import annotations

import time
from typing import Any

from rllm.types import Episode, TerminationReason


class RolloutProgress:
    """Counts finished rollouts and, when enabled and on a TTY, draws a live bar."""

    def __init__(self, total: int, description: str = "rollouts", enabled: bool = True) -> None:
        self.total = total
        self.done = 0
        self.ok = 0
        self.errors = 0
        self.by_reason: dict[str, int] = {}
        self.max_loop_lag_s = 0.0
        self.loop_lag_s = 0.0  # as of the latest episode
        self.started = time.monotonic()
        self._progress: Any = None
        self._task_id: Any = None
        if enabled:
            self._start_bar(description)

    def _start_bar(self, description: str) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        console = Console(stderr=True)
        if not console.is_terminal:
            return
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]:.1f} rollouts/s"),
            TextColumn("ok {task.fields[ok_pct]:.0f}%"),
            TextColumn("[red]errors {task.fields[errors]}"),
            TextColumn("loop lag {task.fields[lag_ms]:.0f} ms"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self._task_id = self._progress.add_task(
            description, total=self.total, rate=0.0, ok_pct=0.0, errors=0, lag_ms=0.0
        )
        self._progress.start()

    @property
    def enabled(self) -> bool:
        return self._progress is not None

    def rate(self) -> float:
        elapsed = time.monotonic() - self.started
        return self.done / elapsed if elapsed > 0 else 0.0

    def update(self, episode: Episode) -> None:
        self.done += 1
        reason = str(episode.termination_reason)
        self.loop_lag_s = episode.metrics.get("loop_lag_s", 0.0)
        self.max_loop_lag_s = max(self.max_loop_lag_s, self.loop_lag_s)
        self.by_reason[reason] = self.by_reason.get(reason, 0) + 1
        if episode.termination_reason in (
            TerminationReason.AGENT_ERROR,
            TerminationReason.INFRA_ERROR,
            TerminationReason.TIMEOUT,
        ):
            self.errors += 1
        else:
            self.ok += 1
        if self._progress is not None:
            self._progress.update(
                self._task_id,
                completed=self.done,
                rate=self.rate(),
                ok_pct=100.0 * self.ok / self.done,
                errors=self.errors,
                lag_ms=self.loop_lag_s * 1e3,
            )

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def summary(self) -> dict[str, float]:
        return {
            "rollouts": float(self.done),
            "rollouts_per_s": self.rate(),
            "success_rate": self.ok / self.done if self.done else 0.0,
            "errors": float(self.errors),
            "loop_lag_max_s": self.max_loop_lag_s,
        }
