"""`rllm export` for this backend: a verl checkpoint as a plain Hugging Face model folder.

Registered as the ``rllm.export`` entry point ``verl``. A verl checkpoint (a step's ``backend/``
folder, marked by ``rllm_verl_state.json``) holds the FSDP shards of every rank
(``model_world_size_W_rank_R.pt``, ``fsdp_config.json``) and the model's config and tokenizer
(``huggingface/``). verl's own merger (``verl.model_merger``'s ``FSDPModelMerger``) joins the
shards into one model folder; it writes the weights in bfloat16, as verl's merger always does.

LoRA runs: the merger writes the base weights and the adapter (``lora_adapter/``, PEFT format)
apart; the export merges the adapter into the base (PEFT's ``merge_and_unload``, in float32) or,
with ``adapter_only``, writes the adapter alone. Megatron checkpoints are refused: their merger
needs megatron-core, which this package does not install.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import tempfile
from pathlib import Path

from rllm.types.errors import ConfigError, MissingExtraError

STATE_FILE = "rllm_verl_state.json"  # the same name backend.py writes (that module needs verl at import)
FSDP_CONFIG = "fsdp_config.json"
HF_FOLDER = "huggingface"
ADAPTER_FOLDER = "lora_adapter"  # where verl's merger writes a LoRA adapter


def export(checkpoint: Path, to: Path, *, adapter_only: bool = False) -> Path | None:
    """Write ``checkpoint`` (a step's ``backend/`` folder) to ``to``; None when it is not this
    backend's (no ``rllm_verl_state.json``), so the caller can ask another backend."""
    checkpoint = Path(checkpoint)
    if not (checkpoint / STATE_FILE).is_file():
        return None
    if not (checkpoint / FSDP_CONFIG).is_file():
        raise ConfigError(
            f"verl checkpoint {checkpoint} has no {FSDP_CONFIG}: only FSDP checkpoints can be exported "
            "(a Megatron one needs verl's Megatron merger and megatron-core)"
        )
    if not (checkpoint / HF_FOLDER / "config.json").is_file():
        raise ConfigError(f"verl checkpoint {checkpoint} has no {HF_FOLDER}/config.json (was it cut short?)")
    to = Path(to)
    with tempfile.TemporaryDirectory(prefix="rllm-verl-export-") as scratch:
        merged = Path(scratch) / "merged"
        _merge_shards(checkpoint, merged)
        adapter = merged / ADAPTER_FOLDER
        if adapter_only and not adapter.is_dir():
            raise ConfigError(
                f"checkpoint {checkpoint} holds full weights, not a LoRA adapter: drop --adapter-only"
            )
        to.mkdir(parents=True, exist_ok=True)
        if adapter_only:
            _copy_contents(adapter, to)
            return to
        if adapter.is_dir():
            _merge_adapter(merged, adapter, to)
        else:
            _copy_contents(merged, to)
    return to


def _merge_shards(checkpoint: Path, target: Path) -> None:
    """verl's FSDP merger: every rank's shards -> one Hugging Face folder."""
    try:
        from verl.model_merger.base_model_merger import ModelMergerConfig
        from verl.model_merger.fsdp_model_merger import FSDPModelMerger
    except ImportError as exc:
        raise MissingExtraError(
            f"exporting a verl checkpoint needs verl ({exc}): pip install 'rllm-backend-verl[verl]'"
        ) from None
    target.mkdir(parents=True)
    config = ModelMergerConfig(
        operation="merge",
        backend="fsdp",
        local_dir=str(checkpoint),
        target_dir=str(target),
        hf_model_config_path=str(checkpoint / HF_FOLDER),
    )
    # Its prints and progress bars stay off the terminal; a failure still raises with its message.
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        FSDPModelMerger(config).merge_and_save()


def _merge_adapter(base: Path, adapter: Path, to: Path) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # float32: merging in low precision would round the adapter's small deltas away.
    model = AutoModelForCausalLM.from_pretrained(str(base), torch_dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    merged.save_pretrained(str(to))
    AutoTokenizer.from_pretrained(str(base)).save_pretrained(str(to))


def _copy_contents(source: Path, to: Path) -> None:
    for item in source.iterdir():
        if item.name == ADAPTER_FOLDER:
            continue
        (shutil.copytree if item.is_dir() else shutil.copy2)(item, to / item.name)
