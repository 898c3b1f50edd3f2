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
    rows: int
    file: str


class DatasetInfo(msgspec.Struct, kw_only=True):
    name: str
    source: str
    columns: ColumnMap
    splits: dict[str, SplitInfo] = msgspec.field(default_factory=dict)
    created: float = 0.0


def rllm_home() -> Path:
    return Path(os.environ.get("RLLM_HOME") or Path.home() / ".rllm")


def sft_dataset_path(name: str) -> Path:
    """Where `rllm dataset from-eval --name NAME` writes its SFT set (token-level JSONL)."""
    _check_name(name)
    return rllm_home() / "sft" / f"{name}.jsonl"


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

    def add(self, name: str, source: str, split: str, columns: ColumnMap, hf_dataset: Any) -> DatasetInfo:
        """Map ``hf_dataset`` (a ``datasets.Dataset``) to Task rows and store it as NAME/SPLIT."""
        _check_name(name)
        rows = to_task_rows(hf_dataset, columns, source)
        folder = self.root / name
        folder.mkdir(parents=True, exist_ok=True)
        import datasets

        datasets.Dataset.from_list(rows).to_parquet(str(folder / f"{split}.parquet"))
        index = self._index()
        entry = index.get(name) or DatasetInfo(name=name, source=source, columns=columns, created=time.time())
        entry.splits[split] = SplitInfo(rows=len(rows), file=f"{name}/{split}.parquet")
        entry.source, entry.columns = source, columns
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
        import datasets

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
    """A ``datasets.Dataset`` from a local jsonl, json, parquet or csv file."""
    if not path.is_file():
        raise CliError(f"file {path} does not exist")
    kind = FORMATS.get(path.suffix.lower())
    if kind is None:
        raise CliError(
            f"file {path}: unsupported format {path.suffix!r} (use .jsonl, .json, .parquet or .csv)"
        )
    import datasets

    try:
        return datasets.load_dataset(kind, data_files=str(path), split="train", cache_dir=str(hub_cache()))
    except Exception as exc:  # datasets raises many types for a malformed file; name the file
        raise CliError(f"file {path} is not valid {kind}: {type(exc).__name__}: {exc}") from None


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
