"""``backend.options.model = "x.gguf"``: imported once into the content-keyed model cache, then
used; the local service resolves it wherever it loads a model or a tokenizer."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from rllm.backends.tinker import model_cache, model_import
from rllm.backends.tinker.config import TinkerBackendConfig
from rllm.backends.tinker.local.model import model_source
from rllm.backends.tinker.local.service import LocalService
from rllm.testing.gguf_files import END_OF_TURN_ID, write_tiny_llama
from rllm.types.errors import NotFoundError


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RLLM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(model_cache, "_resolved", {})
    return tmp_path / "cache"


def test_a_gguf_is_imported_once_and_then_reused(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = write_tiny_llama(tmp_path / "tiny.gguf")
    calls: list[Path] = []
    real_import = model_cache.import_model

    def counting_import(src: Path, out: Path, **kw: object) -> object:
        calls.append(out)
        return real_import(src, out, **kw)  # pyright: ignore[reportArgumentType]

    monkeypatch.setattr(model_cache, "import_model", counting_import)
    folder = Path(model_source(str(source)))
    assert folder.parent == cache / "models" and folder.name.startswith("gguf-")
    assert json.loads((folder / model_import.PROVENANCE).read_text())["dtype"] == "float32"
    assert json.loads((folder / "config.json").read_text())["eos_token_id"] == END_OF_TURN_ID
    # The same content elsewhere, in another process (no in-process memo): no second import.
    moved = tmp_path / "elsewhere" / "renamed.gguf"
    moved.parent.mkdir()
    shutil.copy(source, moved)
    monkeypatch.setattr(model_cache, "_resolved", {})
    assert model_cache.cached_import(moved) == folder
    assert len(calls) == 1
    # Changed content: a new folder.
    write_tiny_llama(source, seed=1)
    os.utime(source, ns=(1, 1))
    assert model_cache.cached_import(source) != folder and len(calls) == 2


def test_the_local_service_hands_the_imported_folder_to_the_tokenizer_user(
    cache: Path, tmp_path: Path
) -> None:
    source = write_tiny_llama(tmp_path / "tiny.gguf")
    service = LocalService(TinkerBackendConfig(model=str(source)))
    path = service.tokenizer_path()
    assert path is not None and (Path(path) / "tokenizer.json").is_file()


def test_a_missing_gguf_is_refused_by_name(cache: Path, tmp_path: Path) -> None:
    with pytest.raises(NotFoundError, match=r"missing\.gguf is not a file \(backend\.options\.model"):
        model_source(str(tmp_path / "missing.gguf"))


def test_cache_root_follows_rllm_cache_dir_then_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("RLLM_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert model_cache.cache_root() == tmp_path / "xdg" / "rllm"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert model_cache.cache_root() == Path.home() / ".cache" / "rllm"
