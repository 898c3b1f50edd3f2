"""Several policies on the local service: one base model, one peft LoRA adapter per policy.

The trained model carries every policy's adapter (the backend's own is ``default``); each policy
has its own LocalTrainer (optimizer, learning rate) over its adapter's parameters only, and a
train step activates the policy's adapter before it trains, so the other adapters take no part
in its forward pass and get no gradient (a held-out loss scores each sequence with its policy's
adapter the same way; an LR schedule's factor scales each policy's own learning rate). The
sampler gets one copy of the model per policy (the frozen base weights are shared, only the
adapters are copied) with that policy's adapter active, and its own SamplerEngine; the sampler server answers a request with the engine its
``model`` names (rllm.backends.tinker.local.server). Checkpoints keep the default adapter where a
single-policy run keeps it and each other policy's under ``policies/NAME/`` (a peft adapter
folder with its optimizer state).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import msgspec
import torch

from rllm.algos.adapters import LoraConfig
from rllm.backends.tinker.config import TinkerBackendConfig
from rllm.backends.tinker.local.checkpoint import ADAPTER_WEIGHTS, OPTIMIZER_FILE
from rllm.backends.tinker.local.model import peft_lora_config
from rllm.types.errors import ConfigError, InputError, NotFoundError

if TYPE_CHECKING:
    from peft import PeftModel

    from rllm.backends.tinker.local.model import PolicyModel
    from rllm.backends.tinker.local.trainer import LocalTrainer
    from rllm.types import TrainSequence

DEFAULT_POLICY = "default"  # peft's name for the first adapter, and the run's default policy
POLICIES_DIR = "policies"
POLICIES_FILE = "policies.json"


class PolicySpec(msgspec.Struct, kw_only=True, frozen=True):
    """One policy as the local service builds it: its adapter shape and optimizer settings."""

    name: str
    lora: LoraConfig
    config: TinkerBackendConfig  # the backend's config with this policy's optimizer keys


def policy_specs(config: TinkerBackendConfig, policies: dict[str, Any]) -> list[PolicySpec]:
    """The run's ``policies.NAME`` sections (rllm.engine.training.policies.PolicySection) as the
    local service builds them; a ConfigError where it cannot."""
    if config.lora.rank < 1:
        raise ConfigError.for_key(
            "backend.options.lora.rank",
            "several policies are LoRA adapters on one base model: set lora.rank >= 1",
        )
    if config.sampler_weights != "copy":
        raise ConfigError.for_key(
            "backend.options.sampler_weights",
            "several policies sample from their own adapters' copies: use sampler_weights='copy'",
        )
    specs = [PolicySpec(name=DEFAULT_POLICY, lora=config.lora, config=config)]
    for name, section in policies.items():
        optimizer = {
            key: getattr(section, key)
            for key in ("learning_rate", "weight_decay", "grad_clip")
            if getattr(section, key) is not None
        }
        specs.append(
            PolicySpec(
                name=name,
                lora=section.lora or config.lora,
                config=msgspec.structs.replace(config, **optimizer),
            )
        )
    return specs


def add_adapters(model: PolicyModel, specs: list[PolicySpec]) -> dict[str, list[str]]:
    """Add every policy's adapter beside ``default`` (torch's seed decides their initial
    weights, as for the first); returns each policy's parameter names, the default active."""
    if not hasattr(model, "peft_config"):
        raise InputError("several policies need a LoRA model (lora.rank >= 1)")
    for spec in specs[1:]:
        lora = peft_lora_config(spec.lora)
        cast("PeftModel", model).add_adapter(spec.name, lora)
    names: dict[str, list[str]] = {}
    for spec in specs:
        activate(model, spec.name)
        names[spec.name] = [n for n, p in model.named_parameters() if p.requires_grad]
    activate(model, DEFAULT_POLICY)
    return names


def activate(model: Any, policy: str) -> None:
    """Make ``policy``'s adapter the one the model runs (and the only one with gradients)."""
    model.set_adapter(policy)


def sampler_copies(
    model: Any, policies: list[str], adapter_names: dict[str, list[str]], dtype: torch.dtype | None = None
) -> dict[str, Any]:
    """One sampler model per policy: the base weights shared with the trained model, every
    adapter copied, the policy's adapter active. With ``dtype`` (``sampler_dtype``) the base is
    cast once, into weights the sampler copies share with each other, never the trainer's."""
    adapters = {name for names in adapter_names.values() for name in names}
    shared = {id(p): p for n, p in model.named_parameters() if n not in adapters}
    if dtype is not None:
        shared = {
            key: torch.nn.Parameter(
                p.detach().to(dtype) if p.is_floating_point() else p.detach(), requires_grad=False
            )
            for key, p in shared.items()
        }
    copies: dict[str, Any] = {}
    for policy in policies:
        copied = copy.deepcopy(model, memo=dict(shared)).eval()
        copied.set_adapter(policy)
        for p in copied.parameters():
            p.requires_grad_(False)
            if dtype is not None and p.is_floating_point() and p.dtype != dtype:
                p.data = p.data.to(dtype)  # its adapters (the base is cast above)
        copies[policy] = copied
    return copies


def copy_adapter(source: torch.nn.Module, target: torch.nn.Module, names: list[str]) -> None:
    """The trained adapter's tensors into a sampler copy."""
    into = dict(target.named_parameters())
    with torch.no_grad():
        for name, param in source.named_parameters():
            if name in names:
                into[name].copy_(param)


def eval_loss_by_policy(
    model: Any, trainers: dict[str, LocalTrainer], batch: list[TrainSequence]
) -> dict[str, float]:
    """Held-out loss with each sequence under its policy's adapter (``metadata["policy"]``, the
    default where unset): ``policy/NAME/loss`` and ``policy/NAME/num_tokens`` for each policy,
    and the token-weighted mean as ``loss``. An unknown policy is an InputError, before any work."""
    by_policy: dict[str, list[TrainSequence]] = {}
    for sequence in batch:
        by_policy.setdefault(str(sequence.metadata.get("policy", DEFAULT_POLICY)), []).append(sequence)
    unknown = sorted(set(by_policy) - set(trainers))
    if unknown:
        raise InputError(f"eval_loss: unknown policy {unknown[0]!r} (policies: {', '.join(trainers)})")
    out: dict[str, float] = {}
    total = tokens = 0.0
    for policy, sequences in by_policy.items():
        activate(model, policy)
        try:
            figures = trainers[policy].eval_loss(sequences)
        finally:
            activate(model, DEFAULT_POLICY)
        out |= {f"policy/{policy}/{key}": value for key, value in figures.items()}
        total += figures["loss"] * figures["num_tokens"]
        tokens += figures["num_tokens"]
    return {"loss": total / tokens, "num_tokens": tokens, **out}


def save_policies(path: Path, model: Any, optimizers: dict[str, torch.optim.Optimizer]) -> None:
    """Each non-default policy's adapter (a peft adapter folder) and optimizer under
    ``path/policies/NAME``; ``policies.json`` lists them."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    for name, optimizer in optimizers.items():
        folder = path / POLICIES_DIR / name
        folder.mkdir(parents=True, exist_ok=True)
        state = get_peft_model_state_dict(model, adapter_name=name)
        save_file({k: v.detach().contiguous() for k, v in state.items()}, str(folder / ADAPTER_WEIGHTS))
        model.peft_config[name].save_pretrained(str(folder))
        torch.save(optimizer.state_dict(), folder / OPTIMIZER_FILE)
    (path / POLICIES_FILE).write_text(json.dumps(sorted(optimizers)))


def load_policies(path: Path, model: Any, optimizers: dict[str, torch.optim.Optimizer]) -> None:
    """Restore what ``save_policies`` wrote, in place; a checkpoint whose policies differ from
    the run's is refused by name."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    listed = path / POLICIES_FILE
    saved = json.loads(listed.read_text()) if listed.is_file() else []
    if sorted(saved) != sorted(optimizers):
        raise InputError(
            f"checkpoint {path} holds policies {sorted(saved) or 'none beside default'}, "
            f"the run has {sorted(optimizers) or 'none beside default'}"
        )
    device = next(model.parameters()).device
    for name, optimizer in optimizers.items():
        folder = path / POLICIES_DIR / name
        if not (folder / ADAPTER_WEIGHTS).is_file():
            raise NotFoundError(f"checkpoint {path} lacks policy {name!r}'s adapter ({folder})")
        weights = load_file(str(folder / ADAPTER_WEIGHTS), device=str(device))
        result = set_peft_model_state_dict(model, weights, adapter_name=name)
        unexpected = getattr(result, "unexpected_keys", [])
        if unexpected:
            raise InputError(f"checkpoint {folder} adapter has keys this model lacks: {unexpected[:5]}")
        lrs = [group["lr"] for group in optimizer.param_groups]
        optimizer.load_state_dict(torch.load(folder / OPTIMIZER_FILE, map_location=device, weights_only=True))
        for group, lr in zip(optimizer.param_groups, lrs, strict=True):
            group["lr"] = lr  # the run's own LR, as checkpoint.load keeps it


__all__ = [
    "DEFAULT_POLICY",
    "PolicySpec",
    "activate",
    "add_adapters",
    "copy_adapter",
    "eval_loss_by_policy",
    "load_policies",
    "policy_specs",
    "sampler_copies",
    "save_policies",
]
