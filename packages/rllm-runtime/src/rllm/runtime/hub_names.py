"""Is a Hugging Face hub name loadable from here? One answer before any hub library is asked.

``transformers`` and ``datasets`` meet a hub they cannot reach by retrying each file (five times,
with back-off, a warning per try; ``datasets`` then tries again through another code path), so a
mistyped name or a machine without network access fails after a minute or more, with pages of
warnings and the cause at their end. :func:`check_hub_name` answers first, in one line naming the
name and the cause, for every command that resolves a hub name (``rllm doctor tokens``, the
gateway's tokenizer loader, ``rllm sft hf:NAME``, ``rllm dataset pull``):

- a name in the local cache (what the libraries load offline) passes without a request;
- ``HF_HUB_OFFLINE=1`` (or ``TRANSFORMERS_OFFLINE``, ``HF_DATASETS_OFFLINE``) and not cached:
  refused as offline;
- otherwise one request to ``$HF_ENDPOINT/api/{models,datasets}/NAME``, without retries: a
  connection that fails is "unreachable", 401/404 (the hub answers 401 for a name that does not
  exist when no token is sent) is "not found", any answer other than 200 is "unreachable" with
  its status.

The loading itself stays the library's: a name that passes is loaded exactly as before.
"""

from __future__ import annotations

import os
import re
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from rllm.types.errors import InputError

DEFAULT_ENDPOINT = "https://huggingface.co"
PROBE_TIMEOUT_S = 10.0
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
HubKind = Literal["model", "dataset"]

# ORG/NAME or a bare legacy NAME: letters, digits, '-', '_', '.' (the hub's own rule, minus its
# length limit); anything else (a path with more parts, a URL) is never a hub name.
_HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")


class HubNameError(InputError):
    """A hub name that cannot be loaded from here; the message names it and the cause."""


def is_hub_name(name: str) -> bool:
    """``name`` is not a path here and has the form of a hub name (``ORG/NAME`` or ``NAME``)."""
    if _HUB_NAME.fullmatch(name) is None or ".." in name or name.endswith("."):
        return False
    return not Path(name).expanduser().exists()


def hub_cache_root() -> Path:
    """Where ``huggingface_hub`` keeps downloaded repositories (``HF_HUB_CACHE``, else ``HF_HOME/hub``)."""
    if cache := os.environ.get("HF_HUB_CACHE"):
        return Path(cache)
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return Path(home) / "hub"


def hub_cache_file(name: str, filename: str, kind: HubKind = "model") -> Path | None:
    """``filename`` of hub repository ``name`` in the local cache (its ``main`` snapshot, or any),
    or None: nothing is downloaded here."""
    repo = _cached_repo(name, kind)
    ref = repo / "refs" / "main"
    if ref.is_file():
        candidate = repo / "snapshots" / ref.read_text().strip() / filename
        if candidate.is_file():
            return candidate
    found = sorted((repo / "snapshots").glob(f"*/{filename}")) if (repo / "snapshots").is_dir() else []
    return found[0] if found else None


def is_cached(name: str, kind: HubKind, cache_dirs: Sequence[Path] = ()) -> bool:
    """Some snapshot of ``name`` is in the hub cache, or (a dataset) a prepared copy is in one of
    ``cache_dirs`` (``datasets``' ``cache_dir``: ``ORG___NAME``), which ``datasets`` loads offline."""
    snapshots = _cached_repo(name, kind) / "snapshots"
    if snapshots.is_dir() and any(snapshots.iterdir()):
        return True
    prepared = name.replace("/", "___")
    return kind == "dataset" and any((Path(d) / prepared).is_dir() for d in cache_dirs)


def hub_offline() -> str | None:
    """The variable that puts the hub libraries offline (``HF_HUB_OFFLINE=1``), or None."""
    for variable in OFFLINE_VARIABLES:
        if os.environ.get(variable, "").strip().upper() in {"1", "ON", "YES", "TRUE"}:
            return f"{variable}={os.environ[variable]}"
    return None


def hub_endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def check_hub_name(name: str, kind: HubKind, *, cache_dirs: Sequence[Path] = ()) -> None:
    """Return when ``name`` (a hub model or dataset name; a local path passes) can be loaded from
    here; else raise :class:`HubNameError` naming it and the cause (offline, unreachable, not found)."""
    if not is_hub_name(name) or is_cached(name, kind, cache_dirs):
        return
    what = f"hub {kind} {name!r}"
    if (offline := hub_offline()) is not None:
        raise HubNameError(f"{what}: the hub is offline ({offline}) and it is not in the local cache")
    endpoint = hub_endpoint()
    url = f"{endpoint}/api/{kind}s/{name}"
    request = urllib.request.Request(url, method="GET", headers=_auth_headers())
    try:
        with urllib.request.urlopen(request, timeout=PROBE_TIMEOUT_S) as answer:
            answer.read(0)
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 404):
            raise HubNameError(
                f"{what}: not found on {endpoint} (HTTP {exc.code}; a private or gated one needs HF_TOKEN)"
            ) from None
        raise HubNameError(f"{what}: {endpoint} is unreachable (HTTP {exc.code})") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        raise HubNameError(
            f"{what}: {endpoint} is unreachable ({reason}) and it is not in the local cache"
        ) from None


def _cached_repo(name: str, kind: HubKind) -> Path:
    return hub_cache_root() / f"{kind}s--{name.replace('/', '--')}"


def _auth_headers() -> dict[str, str]:
    # The token huggingface_hub would send: HF_TOKEN, else the one `hf auth login` saved.
    token = os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")
    if not token:
        home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
        path = Path(os.environ.get("HF_TOKEN_PATH") or os.path.join(home, "token"))
        try:
            token = path.read_text().strip()
        except OSError:
            token = ""
    return {"Authorization": f"Bearer {token}"} if token else {}


__all__ = [
    "HubNameError",
    "check_hub_name",
    "hub_cache_file",
    "hub_cache_root",
    "hub_endpoint",
    "hub_offline",
    "is_cached",
    "is_hub_name",
]
