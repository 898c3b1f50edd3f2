"""The local dataset registry: ``$RLLM_HOME/datasets/NAME/SPLIT.parquet`` plus ``index.json``.

Rows are stored in the ``Task`` shape (id, instruction, ground_truth, metadata; the last two
as JSON text so any value type survives parquet). Files are read and written through the
Hugging Face ``datasets`` library, imported only when a command needs it (it is slow to load).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import msgspec

from rllm.cli.errors import CliError
from rllm.types import Task

FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


class ColumnMap(msgspec.Struct, kw_only=True):
    """Which source column becomes which Task field; other columns go to ``metadata``."""

    instruction: str = "question"
    ground_truth: str | None = "answer"
    id: str | None = None  # None: the row number


class SplitInfo(msgspec.Struct, kw_only=True):
    """One stored split, with where it came from and how its columns were mapped (splits of
    one dataset may come from different files with different columns)."""

    rows: int
    file: str
    source: str = ""  # empty in indexes written before splits kept their own: the dataset's
    columns: ColumnMap | None = None


class DatasetInfo(msgspec.Struct, kw_only=True):
    name: str
    source: str  # the first split's (see SplitInfo for each split's own)
    columns: ColumnMap
    splits: dict[str, SplitInfo] = msgspec.field(default_factory=dict)
    created: float = 0.0

    def split_source(self, split: str) -> str:
        return self.splits[split].source or self.source

    def split_columns(self, split: str) -> ColumnMap:
        return self.splits[split].columns or self.columns


def rllm_home() -> Path:
    return Path(os.environ.get("RLLM_HOME") or Path.home() / ".rllm")


SFT_SET_FILE = "sft.jsonl"


def sft_set_dir(name: str) -> Path:
    """The folder `rllm dataset from-eval --name NAME` writes: its set (token-level JSONL) and
    the record of the command (rllm.engine.training.run_folder)."""
    _check_name(name)
    return rllm_home() / "sft" / name


def sft_dataset_path(name: str) -> Path:
    """Where `rllm dataset from-eval --name NAME` writes its SFT set."""
    return sft_set_dir(name) / SFT_SET_FILE


def legacy_sft_dataset_path(name: str) -> Path:
    """Where sets were written before each had a folder of its own (read still; replaced by --overwrite)."""
    _check_name(name)
    return rllm_home() / "sft" / f"{name}.jsonl"


def find_sft_dataset(name: str) -> Path | None:
    """The file of set NAME, in its folder or (older sets) beside it; None when there is none."""
    try:
        candidates = (sft_dataset_path(name), legacy_sft_dataset_path(name))
    except CliError:  # not a set name at all
        return None
    return next((path for path in candidates if path.is_file()), None)


def sft_sets() -> dict[str, Path]:
    """Every set `rllm dataset from-eval` wrote, by name: its file (in its folder, or beside it)."""
    root = rllm_home() / "sft"
    if not root.is_dir():
        return {}
    found = {p.stem: p for p in root.glob("*.jsonl") if p.is_file()}  # older sets
    found |= {p.parent.name: p for p in root.glob(f"*/{SFT_SET_FILE}") if p.is_file()}
    return dict(sorted(found.items()))


def hub_cache() -> Path:
    """Where ``datasets`` keeps its download and conversion cache: under $RLLM_HOME too."""
    return rllm_home() / "cache" / "datasets"


class DatasetRegistry:
    """Registered datasets under ``root`` (default ``$RLLM_HOME/datasets``)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or rllm_home() / "datasets"
        self.index_path = self.root / "index.json"

    def _index(self) -> dict[str, DatasetInfo]:
        if not self.index_path.is_file():
            return {}
        try:
            return msgspec.json.decode(self.index_path.read_bytes(), type=dict[str, DatasetInfo])
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise CliError(f"dataset index {self.index_path} is unreadable: {exc}") from None

    def _save(self, index: dict[str, DatasetInfo]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.index_path.with_suffix(".tmp")
        tmp.write_bytes(msgspec.json.format(msgspec.json.encode(index), indent=2))
        os.replace(tmp, self.index_path)

    def names(self) -> list[str]:
        return sorted(self._index())

    def has(self, name: str) -> bool:
        return name in self._index()

    def info(self, name: str) -> DatasetInfo:
        index = self._index()
        if name not in index:
            raise CliError(
                f"no registered dataset named {name!r} (registered: {', '.join(sorted(index)) or 'none'})",
                hint="`rllm dataset list` shows them; `rllm dataset register` adds one",
            )
        return index[name]

    def check_new_split(self, name: str, split: str) -> None:
        """Refuse to replace a registered split silently (``force`` in :meth:`add` replaces it)."""
        _check_name(name)
        entry = self._index().get(name)
        if entry is not None and split in entry.splits:
            raise CliError(
                f"dataset {name!r} already has split {split!r} ({entry.splits[split].rows} rows "
                f"from {entry.split_source(split)})",
                hint="pass --force to replace it, or --split NAME to add another split",
            )

    def add(
        self, name: str, source: str, split: str, columns: ColumnMap, hf_dataset: Any, *, force: bool = False
    ) -> DatasetInfo:
        """Map ``hf_dataset`` (a ``datasets.Dataset``) to Task rows and store it as NAME/SPLIT;
        an existing NAME/SPLIT is refused unless ``force``."""
        if not force:
            self.check_new_split(name, split)
        _check_name(name)
        rows = to_task_rows(hf_dataset, columns, source)
        if not rows:
            raise CliError(f"{source} has no rows")
        folder = self.root / name
        folder.mkdir(parents=True, exist_ok=True)
        datasets = quiet_datasets()
        datasets.Dataset.from_list(rows).to_parquet(str(folder / f"{split}.parquet"))
        index = self._index()
        entry = index.get(name) or DatasetInfo(name=name, source=source, columns=columns, created=time.time())
        entry.splits[split] = SplitInfo(
            rows=len(rows), file=f"{name}/{split}.parquet", source=source, columns=columns
        )
        index[name] = entry
        self._save(index)
        return entry

    def remove(self, name: str) -> None:
        index = self._index()
        self.info(name)
        del index[name]
        self._save(index)
        shutil.rmtree(self.root / name, ignore_errors=True)

    def rows(self, name: str, split: str, limit: int | None = None) -> list[dict[str, Any]]:
        info = self.info(name)
        if split not in info.splits:
            raise CliError(f"dataset {name!r} has no split {split!r} (splits: {', '.join(info.splits)})")
        datasets = quiet_datasets()
        data = datasets.Dataset.from_parquet(str(self.root / info.splits[split].file))
        if limit is not None:
            data = data.select(range(min(limit, len(data))))
        return data.to_list()

    def load_tasks(self, name: str, split: str) -> list[Task]:
        return [
            Task(
                id=row["id"],
                instruction=row["instruction"],
                ground_truth=json.loads(row["ground_truth"]),
                metadata=json.loads(row["metadata"]),
            )
            for row in self.rows(name, split)
        ]


def read_local_file(path: Path) -> Any:
    """A ``datasets.Dataset`` from a local jsonl, json, parquet or csv file.

    The usual mistakes get a plain sentence naming the file (and the line), checked here before
    ``datasets`` sees the file: its own errors (DatasetGenerationError, StopIteration, pyarrow's
    text) say neither."""
    if path.is_dir():
        raise CliError(
            f"{path} is a directory, not a file", hint="name one .jsonl, .json, .parquet or .csv file"
        )
    if not path.is_file():
        raise CliError(f"file {path} does not exist")
    kind = FORMATS.get(path.suffix.lower())
    if kind is None:
        raise CliError(
            f"file {path}: unsupported format {path.suffix!r} (use .jsonl, .json, .parquet or .csv)"
        )
    check_local_file(path)
    datasets = quiet_datasets()
    try:
        data = datasets.load_dataset(kind, data_files=str(path), split="train", cache_dir=str(hub_cache()))
    except Exception as exc:  # datasets raises many types for a malformed file; name the file
        raise CliError(f"file {path} is not valid {path.suffix.lstrip('.')}: {_first_line(exc)}") from None
    if len(data) == 0:
        raise CliError(f"file {path} has no rows")
    return data


def check_local_file(path: Path) -> None:
    """Plain sentences for an empty file, a binary text file, a header-only CSV, a line of a
    JSONL file that is not a JSON object, and a JSON file that is not JSON."""
    data = path.read_bytes()
    if not data.strip():
        raise CliError(f"file {path} is empty")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CliError(
            f"file {path} is not text (not UTF-8 at byte {exc.start}): is it really {suffix}?"
        ) from None
    if "\0" in text:
        raise CliError(f"file {path} is not text (it holds NUL bytes): is it really {suffix}?")
    if suffix == ".csv" and len([line for line in text.splitlines() if line.strip()]) < 2:
        raise CliError(f"file {path} has a header but no rows")
    if suffix == ".jsonl":
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise CliError(
                    f"line {number} of {path} is not JSON: {exc.msg} (column {exc.colno})"
                ) from None
            if not isinstance(row, dict):
                raise CliError(f"line {number} of {path} is not a JSON object (one row per line)")
    if suffix == ".json":
        try:
            json.loads(text)
        except json.JSONDecodeError as exc:
            raise CliError(
                f"file {path} is not JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
            ) from None


def quiet_datasets() -> Any:
    """The ``datasets`` module with its progress bars off: register and inspect print one line."""
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    return datasets


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def to_task_rows(hf_dataset: Any, columns: ColumnMap, source: str) -> list[dict[str, Any]]:
    """Task-shaped rows; a column that is missing is a one-line error naming it and the source."""
    present = list(hf_dataset.column_names)
    for field, column in (
        ("instruction", columns.instruction),
        ("ground_truth", columns.ground_truth),
        ("id", columns.id),
    ):
        if column is not None and column not in present:
            raise CliError(
                f"{source}: no column {column!r} for {field} (columns: {', '.join(present)})",
                hint=f"map it with --{field.replace('_', '-')}-column NAME",
            )
    mapped = {columns.instruction, columns.ground_truth, columns.id}
    out = []
    for number, row in enumerate(hf_dataset):
        instruction = row[columns.instruction]
        if not isinstance(instruction, str):
            raise CliError(
                f"{source}: row {number}: column {columns.instruction!r} must hold text, "
                f"got {type(instruction).__name__}"
            )
        out.append(
            {
                "id": str(row[columns.id]) if columns.id else str(number),
                "instruction": instruction,
                "ground_truth": json.dumps(
                    row[columns.ground_truth] if columns.ground_truth else None, default=str
                ),
                "metadata": json.dumps({k: v for k, v in row.items() if k not in mapped}, default=str),
            }
        )
    ids = [r["id"] for r in out]
    if len(set(ids)) != len(ids):
        raise CliError(f"{source}: column {columns.id!r} has duplicate ids (task ids must be unique)")
    return out


def _check_name(name: str) -> None:
    if not name or "/" in name or name.startswith(".") or name != name.strip():
        raise CliError(f"dataset name {name!r} must be a plain name (no '/', no leading '.')")
