"""Run metrics: JSONL (always), TensorBoard and W&B (when installed and enabled), a reward plot."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class MetricsLogger:
    """Writes one JSON line per step to ``OUT/metrics.jsonl`` and mirrors scalars to the sinks."""

    def __init__(
        self, out_dir: Path, *, tensorboard: bool = True, wandb: bool = False, config: Any = None
    ) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        self.path = out_dir / "metrics.jsonl"
        self._file = self.path.open("a", buffering=1)
        self._tb = _tensorboard_writer(out_dir / "tensorboard") if tensorboard else None
        self._wandb = _wandb_run(out_dir, config) if wandb else None

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        self._file.write(json.dumps({"step": step, **metrics}) + "\n")
        scalars = {
            k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)
        }
        if self._tb is not None:
            for key, value in scalars.items():
                self._tb.add_scalar(key, value, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


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


def _tensorboard_writer(path: Path) -> Any:
    try:
        from tensorboard.summary import Writer
    except ImportError:
        log.info("tensorboard is not installed; metrics go to JSONL only")
        return None
    return Writer(str(path))


def _wandb_run(out_dir: Path, config: Any) -> Any:
    try:
        import wandb
    except ImportError:
        log.warning("wandb=true but wandb is not installed; skipping W&B")
        return None
    return wandb.init(dir=str(out_dir), config=config)
