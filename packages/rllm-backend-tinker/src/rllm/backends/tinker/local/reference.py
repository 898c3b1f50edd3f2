"""The KL term's reference policy: the initial weights, as the base model with LoRA's adapters
turned off, or (full fine-tuning) a frozen copy loaded from the model path on first use."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import torch

from rllm.backends.tinker.local.batching import PaddedBatch
from rllm.backends.tinker.local.logprobs import LogitHead, check_head, token_stats
from rllm.types.errors import InputError

if TYPE_CHECKING:
    from peft import PeftModel


class ReferencePolicy:
    def __init__(
        self,
        policy: torch.nn.Module,
        head: LogitHead,
        vocab_size: int,
        loader: Callable[[], torch.nn.Module] | None,
    ) -> None:
        self.policy = policy
        self.head = head
        self.vocab_size = vocab_size
        self.loader = loader
        self.lora = hasattr(policy, "disable_adapter")
        self.model: torch.nn.Module | None = None
        self.model_head: LogitHead | None = None

    def bytes_to_load(self) -> int:
        """What using it will add to memory: a copy of the weights, unless LoRA or loaded."""
        if self.lora or self.model is not None:
            return 0
        return sum(p.numel() * p.element_size() for p in self.policy.parameters())

    def logprobs(self, batch: PaddedBatch, *, chunk: int) -> torch.Tensor:
        """Logprobs of the batch's targets under the initial weights (0 outside the loss mask)."""
        with torch.no_grad():
            if self.lora:
                # hasattr does not narrow the type: the policy is the peft wrapper (LoRA).
                with cast("PeftModel", self.policy).disable_adapter():
                    return token_stats(self.policy, self.head, batch, chunk=chunk).logprobs
            if self.model is None or self.model_head is None:
                if self.loader is None:
                    raise InputError("kl_coef > 0 needs a reference model, but none can be loaded")
                self.model = self.loader()
                self.model_head = check_head(self.model, LogitHead(self.model), self.vocab_size)
            return token_stats(self.model, self.model_head, batch, chunk=chunk).logprobs


__all__ = ["ReferencePolicy"]
