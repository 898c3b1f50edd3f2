"""A run's scalars as a TensorBoard event file, written for a few microseconds a step.

``tensorboard.summary.Writer`` (what ``MetricsLogger`` used before #35 round 8) writes one Event
per scalar, builds each value through ``make_tensor_proto``, hands each record to a writer thread
that opens, appends to and closes the file once per record, and its ``flush()`` waits on that
thread: ~13 ms of CPU a step on two threads for ~50 scalars (benchmarks/RESULTS.md, #35 round 8).
Here a step is ONE Event holding every scalar, the file stays open, and records reach the OS on
``flush()`` (one write(2)), all on the caller's thread: ~0.5 ms a step, most of it tensorboard's
pure-Python CRC-32C of the record.

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
import time
from pathlib import Path
from types import ModuleType

_file_ids = itertools.count()  # two files opened in one second in one process get distinct names


class ScalarEventFile:
    """Appends one Event per step, holding every scalar of the step, to a new event file."""

    def __init__(self, logdir: Path) -> None:
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
        logdir.mkdir(parents=True, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{next(_file_ids)}"
        self.path = logdir / name
        self._file = self.path.open("wb")  # open for the run: no open/append/close per record
        self._records = RecordWriter(self._file)
        header = event_pb2.Event(
            wall_time=time.time(),
            file_version="brain.Event:2",
            source_metadata=event_pb2.SourceMetadata(writer="rllm.engine.tb_events"),
        )
        self._records.write(header.SerializeToString())
        self.flush()

    def add_scalars(self, step: int, scalars: dict[str, float], wall_time: float | None = None) -> None:
        """One Event at ``step`` holding every ``tag -> value`` (stored as float32)."""
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
        self._records.write(event.SerializeToString())

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()  # flushes

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
