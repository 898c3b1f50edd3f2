"""A run's scalars as a TensorBoard event file, for a seventh of the CPU tensorboard's Writer takes.

``tensorboard.summary.Writer`` (what ``MetricsLogger`` used before #35 round 8) writes one Event
per scalar, builds each value through ``make_tensor_proto``, hands each record to a writer thread
that opens, appends to and closes the file once per record, and its ``flush()`` waits on that
thread: ~3 ms of CPU a step for 47 scalars, and ~13 ms a step of activity on two threads in the
quiet-host profile of a toy run (benchmarks/history/issue-35.md, "#35 round 8 — TensorBoard").
Here a step is ONE Event holding every scalar, the file stays open, and records reach the disk
within ``flush_secs`` (a timer flushes whatever the interval gathered) and at close: ~0.4 ms of
CPU a step on the caller's thread, most of it tensorboard's pure-Python CRC-32C of the record.

The format is tensorboard's own: the same file name pattern, the ``brain.Event:2`` header and
tensorboard's record framing (``RecordWriter``: length, masked CRC-32C, data, masked CRC-32C);
each value is a scalar float32 tensor with the scalars plugin's metadata, as the Writer writes
them. The metadata goes with a tag's first value in the file only: TensorBoard reads a tag's
metadata from its first value and ignores it after (what TensorFlow's own summary writers do).
"""

from __future__ import annotations

import importlib
import itertools
import os
import socket
import threading
import time
from pathlib import Path
from types import ModuleType

# How long a logged step may wait in the buffer before it is on disk (TensorBoard polls ~5 s).
FLUSH_SECS = 2.0
_file_ids = itertools.count()  # two files opened in one second in one process get distinct names


class ScalarEventFile:
    """Appends one Event per step, holding every scalar of the step, to a new event file."""

    def __init__(self, logdir: Path, flush_secs: float | None = None) -> None:
        event_pb2, summary_pb2, tensor_shape_pb2, types_pb2 = (
            _proto(name) for name in ("event_pb2", "summary_pb2", "tensor_shape_pb2", "types_pb2")
        )
        from tensorboard.plugins.scalar import metadata as scalars
        from tensorboard.summary.writer.record_writer import RecordWriter

        self._event_pb2, self._tensor_pb2 = event_pb2, _proto("tensor_pb2")
        self._dt_float, self._shape = types_pb2.DT_FLOAT, tensor_shape_pb2.TensorShapeProto()
        self._metadata = summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name=scalars.PLUGIN_NAME),
            data_class=summary_pb2.DataClass.DATA_CLASS_SCALAR,
        )
        self._described: set[str] = set()  # tags whose metadata this file already holds
        self.flush_secs = FLUSH_SECS if flush_secs is None else flush_secs
        self._lock = threading.Lock()  # the file, between the writer's thread and the flush timer
        self._timer: threading.Timer | None = None  # armed while written records wait for a flush
        self._flush_error: Exception | None = None
        logdir.mkdir(parents=True, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{next(_file_ids)}"
        self.path = logdir / name
        # Open for the run (no open/append/close per record); a buffer of many steps, so the OS
        # sees one write per flush interval.
        self._file = self.path.open("wb", buffering=1 << 20)
        self._records = RecordWriter(self._file)
        header = event_pb2.Event(
            wall_time=time.time(),
            file_version="brain.Event:2",
            source_metadata=event_pb2.SourceMetadata(writer="rllm.engine.training.tb_events"),
        )
        self._records.write(header.SerializeToString())
        self._file.flush()

    def add_scalars(self, step: int, scalars: dict[str, float], wall_time: float | None = None) -> None:
        """One Event at ``step`` holding every ``tag -> value`` (stored as float32); on disk within
        ``flush_secs``. A flush that failed (a full disk) is raised here, or by close()."""
        self._raise_flush_error()
        if not scalars:
            return
        event = self._event_pb2.Event(wall_time=time.time() if wall_time is None else wall_time, step=step)
        values = event.summary.value
        for tag, value in scalars.items():
            tensor = self._tensor_pb2.TensorProto(
                dtype=self._dt_float, tensor_shape=self._shape, float_val=[value]
            )
            if tag in self._described:
                values.add(tag=tag, tensor=tensor)
            else:
                values.add(tag=tag, tensor=tensor, metadata=self._metadata)
                self._described.add(tag)
        record = event.SerializeToString()
        with self._lock:
            self._records.write(record)
            if self._timer is None:
                # One flush per interval however many steps it holds: a thread start every few
                # seconds instead of a write(2) per step
                # (benchmarks/history/issue-35.md, "#35 round 8 — TensorBoard").
                self._timer = threading.Timer(self.flush_secs, self._flush_on_timer)
                self._timer.daemon = True
                self._timer.start()

    def _flush_on_timer(self) -> None:
        with self._lock:
            self._timer = None
            if self._file.closed:
                return
            try:
                self._file.flush()
            except Exception as exc:  # raised on the writer's thread, next step or close
                self._flush_error = exc

    def _raise_flush_error(self) -> None:
        if self._flush_error is not None:
            error, self._flush_error = self._flush_error, None
            raise error

    def flush(self) -> None:
        with self._lock:
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._file.close()  # flushes
        self._raise_flush_error()

    @property
    def closed(self) -> bool:
        return self._file.closed


def open_scalar_events(logdir: Path) -> ScalarEventFile | None:
    """A ScalarEventFile in ``logdir``; None when tensorboard is not installed."""
    try:
        import tensorboard  # noqa: F401  # pyright: ignore[reportUnusedImport]
    except ImportError:
        return None
    return ScalarEventFile(logdir)


def _proto(name: str) -> ModuleType:
    """One of tensorboard's generated protobuf modules (they carry no type stubs)."""
    return importlib.import_module(f"tensorboard.compat.proto.{name}")
