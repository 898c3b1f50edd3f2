"""The computing core of the fake training services: a bigram language model per training run.

A model is a [vocab, vocab] logit table (logits[previous token] -> next token), seeded from the
run's seed and trained with torch's AdamW, so the logprobs, losses, gradients and updates the
fakes answer are real numbers that move when a backend trains. Needs torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Self

import torch


@dataclass
class BigramModel:
    """One training run of a fake service: its bigram table and AdamW state."""

    model_id: str
    base_model: str
    lora_rank: int
    logits: torch.nn.Parameter
    optimizer: torch.optim.AdamW
    optimizer_steps: int = 0
    next_seq: int = 1

    @classmethod
    def new(cls, model_id: str, base_model: str, rank: int, seed: int, vocab: int) -> Self:
        """A fresh run with a random table (deterministic for ``seed``)."""
        generator = torch.Generator().manual_seed(seed)
        logits = torch.nn.Parameter(torch.randn(vocab, vocab, generator=generator) * 0.5)
        return cls(model_id, base_model, rank, logits, torch.optim.AdamW([logits]))

    def token_logprobs(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """log p(targets[i] | inputs[i]) under the current table."""
        return torch.log_softmax(self.logits[inputs], dim=-1).gather(-1, targets[:, None]).squeeze(-1)
