"""``backend.options.model = "x.gguf"``: a GGUF model imported once into a cache folder, then used.

The folder is ``$RLLM_CACHE_DIR/models/gguf-<sha256 prefix>-v<format>`` (``RLLM_CACHE_DIR``
defaults to ``$XDG_CACHE_HOME/rllm``, i.e. ``~/.cache/rllm``), keyed by the file's content, so a
changed file is imported again and a moved or renamed one is not. The import is
``model_import.import_model`` itself, in float32 (the dequantised weights exactly; the backend
casts to its own dtype when it loads them), under a file lock so that processes starting
together import once.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from pathlib import Path

from rllm.backends.tinker.model_import import FORMAT_VERSION, PROVENANCE, import_model
from rllm.runtime.file_lock import file_lock
from rllm.types.errors import NotFoundError

logger = logging.getLogger(__name__)
CACHE_DTYPE = "float32"

# (resolved path, size, mtime) → the cache folder: the service resolves its model several times
# at start-up (tokenizer, policy, reference), and hashing 100 MB each time is wasted.
_resolved: dict[tuple[str, int, int], Path] = {}
_resolved_lock = threading.Lock()


def cache_root() -> Path:
    """``$RLLM_CACHE_DIR``, else ``$XDG_CACHE_HOME/rllm``, else ``~/.cache/rllm``."""
    if configured := os.environ.get("RLLM_CACHE_DIR"):
        return Path(configured).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "rllm"


def is_gguf(model: str) -> bool:
    return model.lower().endswith(".gguf")


def cached_import(gguf: str | Path) -> Path:
    """The Hugging Face folder imported from the GGUF file ``gguf``, importing it on first use."""
    path = Path(gguf).expanduser().resolve()
    if not path.is_file():
        raise NotFoundError(f"{gguf} is not a file (backend.options.model names a .gguf file)")
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    with _resolved_lock:
        known = _resolved.get(key)
    if known is not None and (known / PROVENANCE).is_file():
        return known
    target = (
        cache_root() / "models" / f"gguf-{_sha256(path)[:16]}-v{FORMAT_VERSION}"
    )  # its name: rllm-import.json
    if not (target / PROVENANCE).is_file():
        with file_lock(target.parent / f".{target.name}.lock"):
            if not (target / PROVENANCE).is_file():  # another process may have imported it meanwhile
                logger.warning("importing %s into %s (once; later runs reuse it)", path, target)
                import_model(path, target, dtype=CACHE_DTYPE, overwrite=True)
    with _resolved_lock:
        _resolved[key] = target
    return target


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()
