"""Which model a name, a folder or a checkpoint stands for, told apart before anything loads: its
tokenizer (a hash of the vocabulary and the chat template) and its shape (vocab and hidden size).

Token ids mean something only under the tokenizer that made them, and weights load only into a
model of their shape: an SFT set of stored ids trained with another tokenizer learns other words,
silently, and an ``init_from`` checkpoint of another vocab size fails only once the backend has
loaded everything. Both are checked with what is here: the folders' ``config.json`` (a hub name's
from the local Hugging Face cache) and the tokenizers themselves (loaded as the gateway loads them).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import msgspec

from rllm.engine.training.run_folder import read_record
from rllm.runtime.hub_names import hub_cache_file
from rllm.types import ConfigError

CONFIG_FILE = "config.json"
TINY_MODEL = "tiny"


class ModelSignature(msgspec.Struct, kw_only=True, omit_defaults=True):
    source: str  # the model path or hub name it was read from
    tokenizer: str | None = None  # tokenizer_fingerprint (None: no tokenizer found)
    vocab_size: int | None = None
    hidden_size: int | None = None


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A short hash of the tokenizer's vocabulary (added tokens included) and chat template: two
    tokenizers with one fingerprint turn the same conversation into the same ids."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    template = getattr(tokenizer, "chat_template", None)
    doc = json.dumps({"vocab": vocab, "chat_template": template}, ensure_ascii=False, sort_keys=True)
    return hashlib.sha256(doc.encode()).hexdigest()[:16]


def load_tokenizer(model: str) -> Any:
    """``model``'s tokenizer, loaded as the gateway loads it (transformers)."""
    from rllm.gateway.tokenizer_load import load_tokenizer as load

    return load(model)


def check_model_path(model: str, key: str = "backend.options.model") -> None:
    """A model named by a local path (``/...``, ``./...``, ``~/...``, ``*.gguf``, or ``a/b/c``
    whose ``a/`` is a folder here) that is not there: a ConfigError saying so, now, not the hub's
    "Repo id must be in the form ..." once the backend has started. (Any other ``a/b/c`` may be
    a service's own model id, e.g. Fireworks' ``accounts/fireworks/models/NAME``.)"""
    if model == TINY_MODEL or Path(model).expanduser().exists():
        return
    local = model.startswith(("/", ".", "~")) or model.endswith(".gguf")
    local = local or (model.count("/") > 1 and Path(model.split("/", 1)[0]).is_dir())
    if local:
        raise ConfigError.for_key(
            key, f"{model} does not exist (a model folder or .gguf file here, or a hub name ORG/NAME)"
        )


def model_config(model: str) -> dict[str, Any] | None:
    """``model``'s config.json (a folder's, or a hub name's from the local cache), or None."""
    folder = Path(model).expanduser()
    path = folder / CONFIG_FILE if folder.is_dir() else hub_cache_file(model, CONFIG_FILE)
    if path is None or not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _shape(config: dict[str, Any] | None, key: str) -> int | None:
    if config is None:
        return None
    value = config.get(key, (config.get("text_config") or {}).get(key))  # vision-language: its text model
    return value if isinstance(value, int) else None


def model_signature(model: str, *, tokenizer: bool = True) -> ModelSignature:
    """What is known here of ``model`` (a folder or a hub name): its shape from config.json and,
    with ``tokenizer``, its tokenizer's fingerprint (None when it cannot be loaded here)."""
    config = model_config(model)
    fingerprint = None
    if tokenizer:
        try:
            fingerprint = tokenizer_fingerprint(load_tokenizer(model))
        except Exception:  # not loadable here (no files, offline): not compared
            fingerprint = None
    return ModelSignature(
        source=model,
        tokenizer=fingerprint,
        vocab_size=_shape(config, "vocab_size"),
        hidden_size=_shape(config, "hidden_size"),
    )


def run_model(run: Path) -> str | None:
    """The model a training run (train, distill, sft) trains, from its record (``tiny``: the
    run's own ``tiny-model/``); None for a folder without a record."""
    record = read_record(run) if run.is_dir() else None
    if record is None or "backend" not in record.config:
        return None
    options = (record.config.get("backend") or {}).get("options") or {}
    model = str(options.get("model", TINY_MODEL))
    return str(run / "tiny-model") if model == TINY_MODEL else model


def checkpoint_model(checkpoint: Path) -> str | None:
    """The model a checkpoint (``RUN/checkpoints/step_N``) holds weights of: the run's model
    from its record (``tiny``: the run's ``tiny-model/``), or its ``backend/`` itself when that
    is a model folder (full fine-tuning), else a LoRA adapter's base; None when nothing says."""
    weights = checkpoint / "backend"
    model = run_model(checkpoint.parent.parent)
    if (weights / CONFIG_FILE).is_file():
        # The base model names it best (a hint to train it); the weights' own folder otherwise.
        return model if model is not None and Path(model).is_dir() else str(weights)
    if model is not None:
        return model
    adapter = weights / "adapter_config.json"
    if adapter.is_file():
        try:
            base = json.loads(adapter.read_text()).get("base_model_name_or_path")
        except (OSError, ValueError):
            base = None
        return str(base) if base else None
    return None


def signature_differences(expected: ModelSignature, actual: ModelSignature) -> list[str]:
    """What differs, worded for a message ("vocab size 120 vs 98"); only what both sides know."""
    out: list[str] = []
    for field, label in (("vocab_size", "vocab size"), ("hidden_size", "hidden size")):
        a, b = getattr(expected, field), getattr(actual, field)
        if a is not None and b is not None and a != b:
            out.append(f"{label} {a} vs {b}")
    if expected.tokenizer and actual.tokenizer and expected.tokenizer != actual.tokenizer:
        out.append(f"tokenizer {expected.tokenizer} vs {actual.tokenizer}")
    return out


__all__ = [
    "ModelSignature",
    "check_model_path",
    "checkpoint_model",
    "hub_cache_file",
    "load_tokenizer",
    "model_config",
    "model_signature",
    "run_model",
    "signature_differences",
    "tokenizer_fingerprint",
]
