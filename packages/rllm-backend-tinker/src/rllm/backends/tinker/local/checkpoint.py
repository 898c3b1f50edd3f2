"""Checkpoints of the local service: safetensors for weights, torch for optimizer state.

Full fine-tuning writes ``model.safetensors`` + ``config.json`` + the tokenizer, so the directory
is itself a servable Hugging Face model (e.g. by vLLM). LoRA writes ``adapter_model.safetensors``
+ ``adapter_config.json`` (a peft adapter over the base model).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from rllm.types.errors import InputError, NotFoundError

if TYPE_CHECKING:
    from rllm.backends.tinker.local.model import PolicyModel

STATE_FILE = "rllm_backend_state.json"
OPTIMIZER_FILE = "optimizer.pt"
FULL_WEIGHTS = "model.safetensors"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def is_lora(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config")


def save(
    path: Path,
    model: PolicyModel,
    optimizer: torch.optim.Optimizer,
    tokenizer: Any,
    state: dict[str, Any],
    image_processor: Any = None,
) -> None:
    from safetensors.torch import save_file, save_model

    path.mkdir(parents=True, exist_ok=True)
    if is_lora(model):
        from peft import get_peft_model_state_dict

        weights = {k: v.detach().contiguous() for k, v in get_peft_model_state_dict(model).items()}
        save_file(weights, str(path / ADAPTER_WEIGHTS))
        model.peft_config["default"].save_pretrained(str(path))
    else:
        save_model(model, str(path / FULL_WEIGHTS))  # drops tied duplicates (lm_head = embeddings)
        model.config.save_pretrained(str(path))
        tokenizer.save_pretrained(str(path))
        if image_processor is not None:  # a vision-language model loads again only with it
            image_processor.save_pretrained(str(path))
    torch.save(optimizer.state_dict(), path / OPTIMIZER_FILE)
    (path / STATE_FILE).write_text(json.dumps({**state, "lora": is_lora(model)}, indent=2))


def load(path: Path, model: PolicyModel, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Restore weights and optimizer state in place; returns the saved backend state."""
    from safetensors.torch import load_file, load_model

    state_file = path / STATE_FILE
    if not state_file.is_file():
        raise NotFoundError(f"{path} is not a tinker-backend checkpoint (no {STATE_FILE})")
    state = json.loads(state_file.read_text())
    if bool(state.get("lora")) != is_lora(model):
        kind = "LoRA" if state.get("lora") else "full fine-tuning"
        raise InputError(
            f"checkpoint {path} holds {kind} weights but the backend is configured otherwise (lora.rank)"
        )
    device = next(model.parameters()).device
    if is_lora(model):
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(model, load_file(str(path / ADAPTER_WEIGHTS), device=str(device)))
        unexpected = getattr(result, "unexpected_keys", [])
        if unexpected:
            raise InputError(f"checkpoint {path} adapter has keys this model lacks: {unexpected[:5]}")
    else:
        load_model(model, str(path / FULL_WEIGHTS), strict=True, device=str(device))
    # load_state_dict also restores each group's LR as the saving run left it: an SFT run's cosine
    # schedule ends at 0, so an RL run started from it (init_from) trained with LR 0 and never moved.
    # The loading run's own LR (its config, and the schedule it applies each step) is what counts.
    lrs = [group["lr"] for group in optimizer.param_groups]
    optimizer.load_state_dict(torch.load(path / OPTIMIZER_FILE, map_location=device, weights_only=True))
    for group, lr in zip(optimizer.param_groups, lrs, strict=True):
        group["lr"] = lr
    return state
