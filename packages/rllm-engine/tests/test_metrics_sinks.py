"""MetricsLogger mirrors scalars to its sinks off the step's path: every row still arrives, in
order, by close(); a sink that fails fails the run loudly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util.tensor_util import make_ndarray

from rllm.engine.metrics_log import MetricsLogger


def test_every_step_reaches_tensorboard_by_close(tmp_path: Path) -> None:
    logger = MetricsLogger(tmp_path, tensorboard=True)
    for step in range(1, 6):
        logger.log(step, {"reward/mean": step / 10, "batch/task_ids": ["a"], "flag": True})
    logger.close()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    scalars = [(e.step, round(float(make_ndarray(e.tensor_proto)), 6)) for e in events.Tensors("reward/mean")]
    assert scalars == [(i, round(i / 10, 6)) for i in range(1, 6)]
    assert "flag" not in events.Tags()["tensors"]  # booleans are not scalars


class _FullDisk(MetricsLogger):
    def _mirror(self, step: int, scalars: dict[str, float]) -> None:
        raise OSError(f"no space left on device (step {step})")


def test_a_failing_sink_is_raised_not_swallowed(tmp_path: Path) -> None:
    logger = _FullDisk(tmp_path, tensorboard=True)
    logger.log(1, {"reward/mean": 0.5})
    with pytest.raises(OSError, match="no space left"):
        logger.close()
    # metrics.jsonl (what resume reads) was written regardless.
    assert json.loads((tmp_path / "metrics.jsonl").read_text())["step"] == 1


def test_tensorboard_opens_on_the_sink_thread_not_before_the_first_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from rllm.engine import metrics_log

    opened_on: list[str] = []
    real = metrics_log._tensorboard_writer  # pyright: ignore[reportPrivateUsage]

    def recording(path: Path) -> object:
        opened_on.append(threading.current_thread().name)
        return real(path)

    monkeypatch.setattr(metrics_log, "_tensorboard_writer", recording)
    logger = MetricsLogger(tmp_path, tensorboard=True)
    logger.log(1, {"reward/mean": 0.25})
    logger.close()
    # Importing tensorboard (~0.9 s of CPU) ran beside the run's start, not in front of it.
    assert len(opened_on) == 1 and opened_on[0].startswith("rllm-metrics"), opened_on
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Tensors("reward/mean")] == [1]
