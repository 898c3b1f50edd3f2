"""MetricsLogger mirrors scalars to its sinks off the step's path: every row still arrives, in
order, by close(); a sink that fails fails the run loudly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensorboard.backend.event_processing import plugin_event_accumulator
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util.tensor_util import make_ndarray

from rllm.engine.training.metrics_log import MetricsLogger, read_metrics
from rllm.engine.training.tb_events import ScalarEventFile
from rllm.testing import wait_until


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
    def _mirror(self, step: int, scalars: dict[str, float], wall_time: float) -> None:
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

    from rllm.engine.training import metrics_log

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


def _tensorboard_scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar as TensorBoard's server reads it (the plugin accumulator behind the scalars
    dashboard): tag -> [(step, value)], only tags the scalars plugin lists."""
    if not logdir.is_dir():
        return {}
    acc = plugin_event_accumulator.EventAccumulator(str(logdir), size_guidance={"tensors": 0})
    acc.Reload()
    if "scalars" not in acc.ActivePlugins():
        return {}
    tags = acc.PluginTagToContent("scalars")
    return {tag: [(e.step, float(make_ndarray(e.tensor_proto))) for e in acc.Tensors(tag)] for tag in tags}


def test_tensorboard_shows_every_scalar_of_every_step_as_metrics_jsonl_has_it(tmp_path: Path) -> None:
    # A run's row: keys that come and go (a termination reason seen only on some steps), ints,
    # non-scalars (left out) and booleans (not scalars).
    logger = MetricsLogger(tmp_path, tensorboard=True)
    for step in range(1, 41):
        row: dict[str, object] = {
            "reward/mean": step / 40,
            "train/loss": -0.001 * step,
            "episodes": 32,
            "weight_version": step,
            "batch/task_ids": ["a", "b"],
            "flag": step % 2 == 0,
        }
        if step % 3 == 0:
            row["termination/timeout"] = 1 / 32
        logger.log(step, row)
    logger.close()
    expected: dict[str, list[tuple[int, float]]] = {}
    for row in read_metrics(tmp_path / "metrics.jsonl"):
        for key, value in row.items():
            if key != "step" and isinstance(value, int | float) and not isinstance(value, bool):
                expected.setdefault(key, []).append((row["step"], float(np.float32(value))))
    assert _tensorboard_scalars(tmp_path / "tensorboard") == expected
    assert len(expected["termination/timeout"]) == 13 and len(expected["reward/mean"]) == 40


def test_each_step_is_one_event_and_a_tag_is_described_once(tmp_path: Path) -> None:
    events = ScalarEventFile(tmp_path)
    for step in range(1, 4):
        events.add_scalars(step, {"a": 1.0 * step, "b": 2.0})
    events.close()
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    assert [e.step for e in acc.Tensors("a")] == [1, 2, 3]
    assert acc.SummaryMetadata("a").plugin_data.plugin_name == "scalars"
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    loaded = list(EventFileLoader(str(events.path)).Load())
    assert loaded[0].file_version == "brain.Event:2"
    steps = loaded[1:]
    assert [e.step for e in steps] == [1, 2, 3] and all(len(e.summary.value) == 2 for e in steps)
    described = [[v.HasField("metadata") for v in e.summary.value] for e in steps]
    assert described == [[True, True], [False, False], [False, False]]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows=st.lists(
        st.dictionaries(
            st.text(alphabet="abcxyz/_", min_size=1, max_size=12),
            st.floats(allow_nan=False, allow_infinity=False, width=32),
            max_size=6,
        ),
        min_size=1,
        max_size=6,
    )
)
def test_what_tensorboard_reads_back_is_what_was_written(
    tmp_path_factory: pytest.TempPathFactory, rows
) -> None:
    logdir = tmp_path_factory.mktemp("tb")
    events = ScalarEventFile(logdir)
    for step, row in enumerate(rows):
        events.add_scalars(step, row)
    events.close()
    expected: dict[str, list[tuple[int, float]]] = {}
    for step, row in enumerate(rows):
        for tag, value in row.items():
            expected.setdefault(tag, []).append((step, value))
    assert _tensorboard_scalars(logdir) == expected


async def test_a_logged_step_reaches_disk_within_the_flush_interval_not_only_at_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rllm.engine.training import tb_events

    monkeypatch.setattr(tb_events, "FLUSH_SECS", 0.05)
    logger = MetricsLogger(tmp_path, tensorboard=True)
    for step in (1, 2):
        logger.log(step, {"reward/mean": step / 4})
    # The flush timer, not close(), puts both steps on disk (one flush for the interval).
    await wait_until(
        lambda: _tensorboard_scalars(tmp_path / "tensorboard") == {"reward/mean": [(1, 0.25), (2, 0.5)]},
        what="both steps in the event file before close",
    )
    logger.log(3, {"reward/mean": 0.75})
    logger.close()
    assert _tensorboard_scalars(tmp_path / "tensorboard")["reward/mean"][-1] == (3, 0.75)


def test_a_failed_timed_flush_is_raised_at_the_next_step(tmp_path: Path) -> None:
    events = ScalarEventFile(tmp_path, flush_secs=3600.0)
    events.add_scalars(1, {"a": 1.0})

    class FullDisk(Exception):
        pass

    def full_disk() -> None:
        raise FullDisk("no space left on device")

    events._file.flush = full_disk  # pyright: ignore[reportPrivateUsage, reportAttributeAccessIssue]
    events._flush_on_timer()  # pyright: ignore[reportPrivateUsage]  # what the timer runs
    with pytest.raises(FullDisk):
        events.add_scalars(2, {"a": 2.0})
