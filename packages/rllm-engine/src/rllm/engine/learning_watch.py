"""Say so when a run cannot learn: steps in a row that trained on nothing.

A step trains nothing when every group was filtered out, most often because all rollouts of
each task got the same reward (zero variance: no advantage to learn from). The run goes on, its
loss and weights unchanged, and without this warning nothing tells the user.
"""

from __future__ import annotations

NO_LEARNING_STEPS = 3  # consecutive steps with no trainable sequence before the warning

NO_LEARNING_WARNING = (
    "no trainable sequence in {steps} steps in a row: every group was filtered out, so the model "
    "has not been updated (usually all rollouts of a task got the same reward, leaving no advantage "
    "to learn from). Try a larger group_size, a higher rollout.sampling.temperature, a stronger or "
    "better-suited model (backend.options.model), or an easier task; `rllm view` shows the episodes."
)


class NoLearningWatch:
    """Counts consecutive steps that trained nothing; ``observe`` returns the warning once."""

    def __init__(self, steps: int = NO_LEARNING_STEPS) -> None:
        self.steps = steps
        self.idle = 0
        self.warned = False

    def observe(self, trained_sequences: int) -> str | None:
        self.idle = 0 if trained_sequences else self.idle + 1
        if self.idle >= self.steps and not self.warned:
            self.warned = True
            return NO_LEARNING_WARNING.format(steps=self.idle)
        return None
