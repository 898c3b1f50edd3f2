"""One contract for every folder an `rllm` command writes (docs/run-folders.md).

``train``, ``distill``, ``sft``, ``eval``, ``export``, ``model init-tiny``, ``model import`` and
``dataset from-eval`` each write a folder, and each goes through :class:`RunFolder` before any
work starts:

* a folder that holds an earlier result is refused, unless ``--resume`` (where the command can
  continue one) or ``--overwrite``, which replaces it completely: the earlier command's outputs
  are removed first, so no stale file (an adapter beside merged weights) is left behind;
* ``--resume`` with nothing to resume is refused, as is ``--resume`` with ``--overwrite``;
* a folder another command wrote (an eval folder given to ``train``) is refused by name;
* each folder records the command and the resolved config it was started with
  (``rllm-run.json``); ``--resume`` with another config is refused, listing the keys that differ,
  unless each is named in ``--allow-changes`` and is one the kind may change
  (:mod:`rllm.engine.training.run_kinds` says which, and why each is safe).

Every check reads only, so it runs before anything is built; :meth:`RunFolder.begin` then clears
(``--overwrite``) and writes the record. ``--out .`` never loses the user's own files: a run
folder's ``--overwrite`` removes only what its command writes, and a model folder (export, init-tiny,
import) is emptied only when it is one an rLLM command wrote (its record), or one that holds a model.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import msgspec

from rllm.engine.training.checkpoint import latest_checkpoint
from rllm.engine.training.run_kinds import KINDS, LEGACY_SIGNS, RECORD_FILE, FolderKind, kind_named
from rllm.types.errors import RLLMError

UNSET = "<unset>"


class RunFolderError(RLLMError, ValueError):
    """The folder does not fit the request: nothing to resume, an earlier result in the way,
    another command's folder, or a resume with another config."""


class RunRecord(msgspec.Struct, kw_only=True):
    """``rllm-run.json``: what wrote the folder, with which resolved config."""

    kind: str
    command: list[str]
    config: dict[str, Any]
    started: str  # UTC, ISO 8601
    rllm_version: str
    # Each --resume: when, the command, and the keys --allow-changes let through ({key: [old, new]}).
    resumes: list[dict[str, Any]] = msgspec.field(default_factory=list)


def read_record(folder: Path) -> RunRecord | None:
    path = folder / RECORD_FILE
    if not path.is_file():
        return None
    try:
        return msgspec.json.decode(path.read_bytes(), type=RunRecord)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise RunFolderError(
            f"{path} is not a run record ({exc}): move it away or pick another folder"
        ) from None


def flatten(doc: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as dotted keys (``rollout.concurrency``); lists and scalars are leaves."""
    out: dict[str, Any] = {}
    for key, value in doc.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, dotted + "."))
        else:
            out[dotted] = value
    return out


def config_changes(
    old: Mapping[str, Any], new: Mapping[str, Any], ignored: Iterable[str] = (), same_version: bool = True
) -> dict[str, tuple[Any, Any]]:
    """``{key: (old, new)}`` for every dotted key whose value differs. A key under an ``ignored``
    one is skipped; so is a key only ``new`` has when another rLLM version wrote ``old`` (the
    config gained it since)."""
    skip = tuple(ignored)
    flat_old, flat_new = flatten(old), flatten(new)
    changes: dict[str, tuple[Any, Any]] = {}
    for key in sorted(set(flat_old) | set(flat_new)):
        if any(key == s or key.startswith(s + ".") for s in skip):
            continue
        if key not in flat_old and not same_version:
            continue
        before, after = flat_old.get(key, UNSET), flat_new.get(key, UNSET)
        if before != after:
            changes[key] = (before, after)
    return changes


def normalise_key(key: str) -> str:
    """``--allow-changes`` keys as users type them: ``--max-tokens``, ``max-tokens``, ``max_tokens``."""
    key = key.strip().removeprefix("--")
    return key if "." in key else key.replace("-", "_")


def split_keys(items: Iterable[str]) -> list[str]:
    """``--allow-changes a,b --allow-changes c`` as ``[a, b, c]``."""
    return [normalise_key(k) for item in items for k in item.split(",") if k.strip()]


def object_name(obj: Any) -> str:
    """``module:qualname`` of a flow or an evaluator (of its class for an instance)."""
    target = obj if hasattr(obj, "__qualname__") else type(obj)
    return f"{getattr(target, '__module__', '?')}:{getattr(target, '__qualname__', type(obj).__name__)}"


def rllm_version() -> str:
    try:
        return version("rllm-engine")
    except PackageNotFoundError:  # a source tree without metadata
        return "unknown"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _show(value: Any) -> str:
    text = value if value == UNSET else json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


class RunFolder:
    """The folder one command writes (``kind``: the command's name in :data:`KINDS`), with the
    resolved ``config`` it runs with. ``flag`` names the folder as the user gave it (``--out``,
    ``--to``, ``PATH``) in messages."""

    def __init__(
        self,
        path: str | Path,
        kind: str,
        config: Mapping[str, Any] | None = None,
        *,
        flag: str = "--out",
        command: Sequence[str] | None = None,
    ) -> None:
        self.path = Path(path)
        self.kind: FolderKind = kind_named(kind)
        # As JSON holds it, so a tuple and a list (or 1 and 1.0 from a file) compare alike.
        self.config: dict[str, Any] = json.loads(msgspec.json.encode(dict(config or {})))
        self.flag = flag
        self.command = list(command) if command is not None else ["rllm", *sys.argv[1:]]

    # What is there -----------------------------------------------------------------------
    def record(self) -> RunRecord | None:
        return read_record(self.path) if self.path.is_dir() else None

    def entries(self) -> list[Path]:
        """What the folder holds apart from its record."""
        if not self.path.is_dir():
            return []
        return sorted(p for p in self.path.iterdir() if p.name != RECORD_FILE)

    def holds_result(self) -> bool:
        if not self.kind.markers:
            return bool(self.entries())
        return any((self.path / name).exists() for name in self.kind.markers)

    def can_resume(self) -> bool:
        if self.kind.resume == "checkpoint":
            return latest_checkpoint(self.path) is not None
        if self.kind.resume == "results":
            results = self.path / "results.jsonl"
            return results.is_file() and results.stat().st_size > 0
        return False

    def _other_writer(self, record: RunRecord | None) -> str | None:
        """What another command left here, worded for a message; None when it is this kind's."""
        if record is not None:
            if record.kind == self.kind.name:
                return None
            other = KINDS.get(record.kind)
            what = other.what if other else f"a {record.kind!r} folder"
            return f"{what} written by `rllm {record.kind}`"
        for name, kind, what in LEGACY_SIGNS:  # written before records existed
            if (self.path / name).exists():
                return None if KINDS[kind].family == self.kind.family else what
        return None

    # The contract -----------------------------------------------------------------------------
    def check(
        self, *, resume: bool = False, overwrite: bool = False, allow_changes: Iterable[str] = ()
    ) -> RunRecord | None:
        """The folder's record (None: a fresh folder, or one from before records); a
        RunFolderError when the folder does not fit. Reads only."""
        where, cmd = self.path, self.kind.command
        if resume and overwrite:
            raise RunFolderError("--resume and --overwrite contradict each other: pick one")
        if resume and self.kind.resume is None:
            raise RunFolderError(f"`{cmd}` cannot --resume: pass --overwrite to replace {where}")
        if allow_changes and not resume:
            raise RunFolderError("--allow-changes applies to --resume only")
        if where.exists() and not where.is_dir():
            raise RunFolderError(f"{self.flag} {where} is a file, not a folder")
        record = self.record()
        if (other := self._other_writer(record)) is not None:
            raise RunFolderError(
                f"{self.flag} {where} holds {other}; `{cmd}` does not write into another command's "
                f"folder: pass another {self.flag}"
            )
        if resume:
            self._check_resume(record, allow_changes)
            return record
        if self.kind.outputs is None and record is None and self.entries():
            self._check_model_folder()  # a folder of the user's files is never called a model
        if self.holds_result() and not overwrite:
            again = "pass --resume to continue it, " if self.kind.resume else "pass "
            raise RunFolderError(
                f"{self.flag} {where} already holds {self.kind.what} (`{cmd}`): {again}"
                f"--overwrite to replace it, or another {self.flag}"
            )
        return record

    def _check_resume(self, record: RunRecord | None, allow_changes: Iterable[str]) -> None:
        where = self.path
        if not where.is_dir():
            raise RunFolderError(f"--resume: {self.flag} {where} does not exist (nothing to resume)")
        if not self.can_resume():
            missing = (
                f"no complete checkpoint ({where / 'checkpoints'}/step_*/trainer_state.json)"
                if self.kind.resume == "checkpoint"
                else f"no results ({where / 'results.jsonl'})"
            )
            raise RunFolderError(f"--resume: {self.flag} {where} has {missing}; nothing to resume")
        if record is None:
            return  # written before records: nothing to compare against (begin() records one now)
        changes = config_changes(
            record.config, self.config, self.kind.ignored, record.rllm_version == rllm_version()
        )
        allowed = set(split_keys(allow_changes))
        for key in sorted(allowed - set(self.kind.changeable)):
            raise RunFolderError(
                f"--allow-changes {key}: not a key --resume may change for `{self.kind.command}` "
                f"(it may change: {', '.join(self.kind.changeable) or 'none'})"
            )
        refused = {k: v for k, v in changes.items() if k not in allowed}
        if not refused:
            return
        shown = ", ".join(f"{k} (run: {_show(a)}, now: {_show(b)})" for k, (a, b) in refused.items())
        fixed = [k for k in refused if k not in self.kind.changeable]
        may = [k for k in refused if k in self.kind.changeable]
        advice = "resume with the run's own settings"
        if may:
            advice += f", or let {', '.join(may)} through with --allow-changes {','.join(may)}"
        if fixed:
            advice += (
                f"; {', '.join(fixed)} cannot change within a run: start a new one "
                f"(another {self.flag}, or --overwrite)"
            )
        raise RunFolderError(f"--resume: {where} was started with another config: {shown}; {advice}")

    def _check_model_folder(self) -> None:
        """A folder that is replaced whole (a model, an SFT set) and has no record: it must hold
        what such a command writes (a folder from before records), never only the user's own
        files, which --overwrite would empty and which are no earlier result to name."""
        signs = ("config.json", "adapter_config.json", *self.kind.markers)
        if not any((self.path / name).exists() for name in signs):
            shown = ", ".join(p.name for p in self.entries()[:3])
            raise RunFolderError(
                f"{self.flag} {self.path} holds files no rLLM command wrote ({shown}, ...): "
                f"`{self.kind.command}` writes a new folder, and --overwrite replaces only one "
                f"`{self.kind.command}` or another model writer wrote; pick an empty or new {self.flag}"
            )

    def begin(
        self, *, resume: bool = False, overwrite: bool = False, allow_changes: Iterable[str] = ()
    ) -> RunRecord:
        """:meth:`check`, then (``overwrite``) remove the earlier result and write the record."""
        earlier = self.check(resume=resume, overwrite=overwrite, allow_changes=allow_changes)
        if overwrite:
            self.clear()
        self.path.mkdir(parents=True, exist_ok=True)
        now = _now()
        if resume and earlier is not None:
            same = earlier.rllm_version == rllm_version()
            changed = config_changes(earlier.config, self.config, self.kind.ignored, same)
            record = msgspec.structs.replace(
                earlier,
                config=self.config,
                resumes=[
                    *earlier.resumes,
                    {"at": now, "command": self.command, "changed": {k: list(v) for k, v in changed.items()}},
                ],
            )
        else:
            record = self.new_record()
        self.write_record(record)
        return record

    def new_record(self) -> RunRecord:
        return RunRecord(
            kind=self.kind.name,
            command=self.command,
            config=self.config,
            started=_now(),
            rllm_version=rllm_version(),
        )

    def write_record(self, record: RunRecord) -> None:
        path = self.path / RECORD_FILE
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(msgspec.json.format(msgspec.json.encode(record), indent=2) + b"\n")
        os.replace(tmp, path)

    def clear(self) -> None:
        """Remove the earlier result: the kind's outputs (a model folder: everything) and the record."""
        if not self.path.is_dir():
            return
        if self.kind.outputs is None:
            for entry in self.path.iterdir():
                _remove(entry)
            return
        for name in (*self.kind.outputs, RECORD_FILE):
            _remove(self.path / name)


# The training run's folder, as `rllm train` has always named these (the Trainer, `rllm serve`).
RUN_MARKERS = KINDS["train"].markers


def holds_a_run(out_dir: Path) -> bool:
    """Whether ``out_dir`` holds a training run (train, distill or sft): a checkpoint or metrics."""
    return any((out_dir / name).exists() for name in RUN_MARKERS)


__all__ = [
    "RECORD_FILE",
    "RunFolder",
    "RunFolderError",
    "RunRecord",
    "config_changes",
    "flatten",
    "holds_a_run",
    "object_name",
    "read_record",
    "split_keys",
]
