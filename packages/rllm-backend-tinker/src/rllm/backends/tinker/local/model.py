"""Loading the policy: device/dtype/thread choice, transformers causal LM, optional LoRA."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import torch

from rllm.algos.adapters import LoraConfig
from rllm.backends.tinker.config import TinkerBackendConfig
from rllm.types.errors import InputError

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    # The trainable model: a transformers model, or the peft wrapper of one (LoRA).
    PolicyModel: TypeAlias = PreTrainedModel | PeftModel

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    """``auto`` picks CUDA when present, else CPU; anything else must be available."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InputError(f"TinkerBackendConfig.device={name!r} but CUDA is not available here")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """``auto`` means bf16 on CUDA (halves memory, tensor cores) and fp32 on CPU (bf16 is slow there)."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else torch.float32
    return _DTYPES[name]


def configure_threads(requested: int, device: torch.device) -> int:
    """On CPU, use every core up to 4: small matmuls gain little beyond that and the sampler,
    the trainer and the gateway share the machine. Returns the thread count set."""
    if device.type != "cpu":
        return torch.get_num_threads()
    count = requested or max(1, min(os.cpu_count() or 1, 4))
    torch.set_num_threads(count)
    return count


def load_tokenizer(path: str) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None:  # left-padded batches need a pad id; it is always masked out
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def model_source(model: str) -> str:
    """A local directory (``~`` expanded) when one exists, else the name as given: a hub name,
    which transformers downloads (or finds in the hub cache). A ``.gguf`` file is imported once
    into the model cache and its folder used (``rllm.backends.tinker.model_cache``)."""
    from rllm.backends.tinker.model_cache import cached_import, is_gguf

    if is_gguf(model):
        return str(cached_import(model))
    path = Path(model).expanduser()
    return str(path) if path.exists() else model


def load_pretrained(source: str, dtype: torch.dtype, device: torch.device) -> PreTrainedModel:
    """A causal LM, or a vision-language model (image-text-to-text) when the config has a
    vision tower, on ``device``."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    config = AutoConfig.from_pretrained(source)
    loader = AutoModelForImageTextToText if hasattr(config, "vision_config") else AutoModelForCausalLM
    model = loader.from_pretrained(source, dtype=dtype)
    # transformers declares PreTrainedModel.to as functools.wraps(nn.Module.to), which type
    # checkers read as an unbound function (the device lands on ``self``).
    return model.to(device)  # pyright: ignore[reportArgumentType]


def peft_lora_config(lora: LoraConfig) -> Any:
    """peft's LoraConfig for an adapter of shape ``lora`` (the run's, or a policy's)."""
    from peft import LoraConfig as PeftLoraConfig

    return PeftLoraConfig(
        r=lora.rank,
        # peft annotates an int, but only ever divides by it (alpha / r): a float alpha works.
        lora_alpha=lora.alpha,  # pyright: ignore[reportArgumentType]
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        task_type="CAUSAL_LM",
    )


def load_policy(config: TinkerBackendConfig, device: torch.device, dtype: torch.dtype) -> PolicyModel:
    """The trainable model: the base LM, wrapped with LoRA adapters when ``lora.rank > 0``.

    Dropout stays off (eval mode) for training too, so training logprobs match the sampler's.
    """
    if not config.model:
        raise InputError("TinkerBackendConfig.model is empty: give a local model directory or a hub name")
    torch.manual_seed(config.seed)
    model: PolicyModel = load_pretrained(model_source(config.model), dtype, device)
    if config.lora.rank > 0:
        from peft import get_peft_model

        lora = peft_lora_config(config.lora)
        model = get_peft_model(model, lora)
    # Gradient checkpointing is the trainer's (local/recompute.py): it needs no training mode.
    model.eval()
    return model
