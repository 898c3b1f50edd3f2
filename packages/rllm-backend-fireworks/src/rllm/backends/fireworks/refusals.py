"""The algorithm options the Fireworks backend refuses at validation, each named.

Every loss runs as rllm.algos' own loss through ``forward_backward_custom``, so every loss and
aggregation mode is honoured exactly. What the service cannot give that loss is refused
(facts from the SDK's TINKER_COMPATIBILITY.md):

- ``kl_coef`` > 0: a KL penalty needs a frozen reference. Fireworks rejects it on serverless and
  needs a separately provisioned dedicated reference trainer otherwise ("no implicit
  fallback"); this backend provisions none, and must not silently use the base model instead.
- ``entropy_coef`` != 0: the custom loss receives per-token logprobs only, no entropy.
- ``tis``: the datum's sampler logprobs are the old policy (as on Tinker), so there is no
  trainer/sampler mismatch term to correct.
"""

from __future__ import annotations

from rllm.algos.config import AlgorithmConfig
from rllm.tinker_api import unsupported_algo_options
from rllm.types.errors import InputError

SERVICE = "Fireworks (fireworks-ai training SDK)"


def check_supported(algo: AlgorithmConfig) -> None:
    """Raise ValueError naming every option the Fireworks service cannot honour."""
    problems = unsupported_algo_options(algo, SERVICE)
    if algo.kl_coef > 0:
        problems.append(
            "(`kl_coef`: Fireworks rejects a KL penalty on serverless trainers and needs a separately "
            "provisioned frozen reference trainer otherwise; this backend provisions none)"
        )
    if problems:
        raise InputError("the fireworks backend cannot honour: " + "; ".join(problems))
