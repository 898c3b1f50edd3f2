"""``CombinedReward``: a judge and programmatic rewards as one evaluator (a weighted sum).

Each part is any evaluator (``@evaluator`` function, object with ``evaluate``, a judge, a
``GroupGather``), its result normalised by ``to_eval_output``. The reward is the weighted sum;
every part's reward is reported as the signal ``reward/<name>`` and its own signals are kept;
``is_correct`` comes from the part named ``correct_from`` (unset otherwise). A part that marked
the episode ``infra_error`` (a judge that failed) makes the whole verdict that failure: a sum
with a missing term would be a made-up score.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

from rllm.sdk.evaluator import as_evaluator, to_eval_output
from rllm.types import Episode, EvalOutput, Signal, Task, TerminationReason
from rllm.types.errors import InputError


class CombinedReward:
    """Evaluator: ``sum(weight * part.reward)`` over ``parts`` = [(name, evaluator, weight), ...]."""

    def __init__(self, parts: Sequence[tuple[str, Any, float]], *, correct_from: str | None = None) -> None:
        if not parts:
            raise InputError("CombinedReward needs at least one part")
        names = [name for name, _, _ in parts]
        if len(set(names)) != len(names):
            raise InputError(f"CombinedReward part names must be unique, got {names}")
        if correct_from is not None and correct_from not in names:
            raise InputError(f"correct_from={correct_from!r} names no part (parts: {names})")
        self.parts = [(name, as_evaluator(ev), float(weight)) for name, ev, weight in parts]
        self.correct_from = correct_from

    async def evaluate(self, task: Task, episode: Episode) -> EvalOutput:
        total = 0.0
        signals: list[Signal] = []
        metadata: dict[str, Any] = {}
        correct: bool | None = None
        for name, part, weight in self.parts:
            value = part.evaluate(task, episode)
            if inspect.isawaitable(value):
                value = await value
            output = to_eval_output(value, source=f"reward part {name!r}")
            if episode.termination_reason == TerminationReason.INFRA_ERROR:
                output.metadata.setdefault("failed_part", name)
                return output  # that part could not score: no sum without it
            total += weight * output.reward
            signals += [Signal(name=f"reward/{name}", value=output.reward), *output.signals]
            if output.metadata:
                metadata[name] = output.metadata
            if name == self.correct_from:
                correct = output.is_correct
        return EvalOutput(reward=total, is_correct=correct, signals=signals, metadata=metadata)
