"""`rllm export` for this backend: a local-service checkpoint as a plain Hugging Face model folder.

Registered as the ``rllm.export`` entry point ``tinker``. Full fine-tuning checkpoints already
are model folders (weights, config, tokenizer): the export copies them without the optimizer and
trainer state. LoRA checkpoints hold a PEFT adapter over the base model named in the state file:
the export merges it into the base (``merge_and_unload``) and writes the merged model and the
base's tokenizer, or with ``adapter_only`` the adapter alone in PEFT format, pointing at the base.
transformers and vLLM load either.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from rllm.backends.tinker.local.checkpoint import ADAPTER_WEIGHTS, OPTIMIZER_FILE, STATE_FILE
from rllm.backends.tinker.local.policies import DEFAULT_POLICY, POLICIES_DIR, POLICIES_FILE
from rllm.types import ConfigError

# What a checkpoint holds for resuming only, or for the other policies: never part of an exported model.
TRAINING_ONLY = {OPTIMIZER_FILE, STATE_FILE, POLICIES_DIR, POLICIES_FILE}


def export(
    checkpoint: Path, to: Path, *, adapter_only: bool = False, policy: str | None = None
) -> Path | None:
    """Write ``checkpoint`` (a step's ``backend/`` folder) to ``to``; None when it is not this
    backend's (no ``rllm_backend_state.json``), so the caller can ask another backend. ``policy``:
    that policy's adapter of a run with several (local/policies.py); the default one otherwise."""
    state_file = checkpoint / STATE_FILE
    if not state_file.is_file():
        return None
    state = json.loads(state_file.read_text())
    lora = bool(state.get("lora"))
    if adapter_only and not lora:
        raise ConfigError(
            f"checkpoint {checkpoint} holds full weights, not a LoRA adapter: drop --adapter-only"
        )
    source = policy_folder(checkpoint, policy)
    to.mkdir(parents=True, exist_ok=True)
    if not lora or adapter_only:
        for item in source.iterdir():
            if item.name not in TRAINING_ONLY:
                (shutil.copytree if item.is_dir() else shutil.copy2)(item, to / item.name)
        if adapter_only:
            _point_adapter_at(to, str(state.get("model", "")))
        return to
    _merge(source, str(state["model"]), to)
    return to


def policy_folder(checkpoint: Path, policy: str | None) -> Path:
    """Where policy ``policy``'s adapter lies in ``checkpoint`` (ConfigError naming those it has)."""
    if policy is None or policy == DEFAULT_POLICY:
        return checkpoint
    listed = checkpoint / POLICIES_FILE
    saved = json.loads(listed.read_text()) if listed.is_file() else []
    if policy not in saved:
        raise ConfigError(
            f"checkpoint {checkpoint} has no policy {policy!r} (policies: {', '.join([DEFAULT_POLICY, *saved])})",
            "--policy",
        )
    return checkpoint / POLICIES_DIR / policy


def _point_adapter_at(folder: Path, base: str) -> None:
    """The adapter's config names its base model, so PEFT (and vLLM's LoRA) find it."""
    config_path = folder / "adapter_config.json"
    config = json.loads(config_path.read_text())
    if base:
        config["base_model_name_or_path"] = base
    config_path.write_text(json.dumps(config, indent=2))


def _merge(checkpoint: Path, base: str, to: Path) -> None:
    import torch
    from peft import PeftModel

    from rllm.backends.tinker.local.model import load_pretrained, load_tokenizer, model_source

    if not (checkpoint / ADAPTER_WEIGHTS).is_file():
        raise ConfigError(f"checkpoint {checkpoint} is a LoRA checkpoint without {ADAPTER_WEIGHTS}")
    source = model_source(base)
    # float32 on the CPU: merging in low precision would round the adapter's small deltas away.
    model = load_pretrained(source, torch.float32, torch.device("cpu"))
    merged = PeftModel.from_pretrained(model, str(checkpoint)).merge_and_unload()
    merged.save_pretrained(str(to))
    load_tokenizer(source).save_pretrained(str(to))
