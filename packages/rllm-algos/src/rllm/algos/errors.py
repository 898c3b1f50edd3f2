"""Errors raised by rllm.algos when its input cannot give a meaningful result."""

from __future__ import annotations

from rllm.types.errors import RLLMError


class AlgorithmInputError(RLLMError, ValueError):
    """Episodes, groups, rewards or tensors that would give a wrong or NaN result.

    Raised instead of producing a silent NaN advantage or loss; the message names what was wrong
    and where (episode id, trajectory name, tensor name and position).
    """


class RewardError(AlgorithmInputError):
    """A trajectory has no usable reward (missing, NaN or infinite), or a group mixes rewarded
    and unrewarded trajectories."""
