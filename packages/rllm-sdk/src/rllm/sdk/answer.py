"""Find the text an evaluator should grade in a finished episode."""

from __future__ import annotations

from rllm.types import Episode


def final_answer(episode: Episode, role: str | None = None) -> str:
    """The episode's answer: ``artifacts["answer"]`` if the flow returned one, else the text of the
    last model output (of ``role`` if given, else of the first trajectory that has one).

    Evaluators use this so a flow that just returns ``None`` is still gradable from its traces.
    """
    answer = episode.artifacts.get("answer")
    if answer is not None:
        return str(answer)
    trajectories = episode.trajectories
    if role is not None:
        trajectories = [t for t in trajectories if t.role == role]
    for trajectory in trajectories:
        for step in reversed(trajectory.steps):
            if step.output is not None:
                return step.output.text
    return ""
