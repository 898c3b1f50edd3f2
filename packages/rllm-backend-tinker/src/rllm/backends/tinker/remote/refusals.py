"""The options the remote Tinker service cannot honour: the algorithm refusals every Tinker-API
service shares (rllm.tinker_api) plus those of this backend's own config."""

from __future__ import annotations

from rllm.algos.config import AlgorithmConfig
from rllm.backends.tinker.config import TinkerBackendConfig
from rllm.tinker_api import unsupported_algo_options
from rllm.types.errors import InputError


def check_supported(algo: AlgorithmConfig, config: TinkerBackendConfig) -> None:
    """Raise ValueError naming every option the remote service cannot honour."""
    problems = unsupported_algo_options(algo, "the remote service")
    if config.lora.rank == 0:
        problems.append(
            "`lora.rank` = 0 (full fine-tuning): the Tinker service trains LoRA adapters; set lora.rank > 0"
        )
    if config.lora.target_modules != "all-linear":
        problems.append(
            "`lora.target_modules`: Tinker chooses its LoRA targets itself; leave it 'all-linear'"
        )
    if config.micro_batch_tokens not in ("auto", 0):
        problems.append('`micro_batch_tokens`: Tinker splits requests itself; leave it "auto"')
    if config.pack_tokens:
        problems.append("`pack_tokens`: packing is done by the local service only; leave it 0")
    if problems:
        raise InputError("the tinker backend's remote service cannot honour: " + "; ".join(problems))
