"""Loading a tokenizer without transformers' auto classes where the class is known from the files.

``AutoTokenizer`` lives in ``transformers.models.auto``, whose import pulls the whole model
stack (``transformers.generation`` -> ``masking_utils`` -> ``torch._dynamo`` + inductor, sympy,
accelerate): about 2.5 s of CPU on top of ``import torch, transformers``, paid by every process
that only needs a tokenizer (a flow process's gateway, ``rllm eval``'s gateway). For a local
directory whose files say which class AutoTokenizer picks, :func:`load_tokenizer` loads that
class directly; anything else (a hub name, remote code, another class, a model type not listed
below) goes through ``AutoTokenizer`` as before. Same files, same class, same call: the same
tokenizer (tests/test_gateway_tokenizer_load.py compares the two).

``RLLM_AUTO_TOKENIZER=1`` turns the direct path off (to measure it against the auto path).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rllm.runtime.hub_names import check_hub_name

AUTO_ONLY_ENV = "RLLM_AUTO_TOKENIZER"

# Model types for which AutoTokenizer, given a tokenizer_config.json naming ``TokenizersBackend``
# and no ``auto_map``, returns ``TokenizersBackend.from_pretrained(path)``: none of them is in
# transformers' MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS (those get their registered class) nor
# maps to MistralCommonBackend (tekken files). rllm's tiny models are llama (text) and qwen2_vl
# (vision); tests check this list against transformers' own tables, so an upgrade that changes
# the rule fails there instead of loading a different class here.
DIRECT_MODEL_TYPES = frozenset({"llama", "qwen2_vl", "qwen3", "qwen3_moe"})


def direct_tokenizer_class(path: str) -> str | None:
    """The class AutoTokenizer would load for ``path`` when the direct path knows it for sure
    (today only ``TokenizersBackend``), else None (the auto path decides)."""
    if os.environ.get(AUTO_ONLY_ENV) == "1":
        return None
    directory = Path(path)  # as AutoTokenizer reads it (no ``~`` expansion: callers do that)
    if not (directory / "tokenizer.json").is_file():
        return None
    try:
        tokenizer_config = json.loads((directory / "tokenizer_config.json").read_text())
        config = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):  # missing or unreadable: AutoTokenizer reports it its own way
        return None
    if not isinstance(tokenizer_config, dict) or not isinstance(config, dict):
        return None
    if "auto_map" in tokenizer_config or "auto_map" in config:  # remote code decides
        return None
    if config.get("model_type") not in DIRECT_MODEL_TYPES or config.get("tokenizer_class") is not None:
        return None
    if tokenizer_config.get("tokenizer_class") != "TokenizersBackend":
        return None
    return "TokenizersBackend"


def load_tokenizer(path: str) -> Any:
    """``AutoTokenizer.from_pretrained(path)``'s tokenizer, without importing the auto classes
    when :func:`direct_tokenizer_class` knows the class. A hub name that cannot be loaded from
    here (offline, hub unreachable, no such model) is refused first, in one line
    (:class:`rllm.runtime.hub_names.HubNameError`), not after transformers' retries."""
    check_hub_name(path, "model")
    if direct_tokenizer_class(path) == "TokenizersBackend":
        from transformers.tokenization_utils_tokenizers import TokenizersBackend

        return TokenizersBackend.from_pretrained(path)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)
