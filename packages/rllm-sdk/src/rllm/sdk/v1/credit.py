"""Rewards for both V1 roles, one per LLM call, and the numbers an evaluation reports.

The gateway records all of a role's calls as one trajectory. V1 rewards each call on its own,
so :func:`v1_credit` splits the ``generate`` and ``verify`` trajectories into one single-step
trajectory per call (same name, so the N candidates of a task form one group) and keys every
reward by trajectory id (``EvalOutput.trajectory_rewards`` accepts ids as well as role names):

- a generation call earns 1.0 when its candidate is correct, else 0.0;
- a verification call of a mixed pair earns 1.0 when it names the correct candidate, else 0.0;
- a verification call whose two candidates are both right or both wrong carries no signal: it is
  renamed ``<verify role>.no_signal`` with reward 0.0, a group of equal rewards that the
  zero-variance filter drops (and whose advantages are 0 should the filter be off).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from rllm.sdk.v1.solve import prompt_key
from rllm.sdk.v1.verdict import Verdict, parse_verdict
from rllm.types import Episode, Signal, Trajectory
from rllm.types.errors import InputError

NO_SIGNAL_SUFFIX = ".no_signal"


@dataclass
class V1Credit:
    """Per-trajectory rewards (by id) and report signals for one episode."""

    trajectory_rewards: dict[str, float] = field(default_factory=dict)
    signals: list[Signal] = field(default_factory=list)
    winner_correct: bool = False


def split_role(episode: Episode, role: str) -> list[Trajectory]:
    """Replace trajectory ``role`` by one single-step trajectory per step (same name); return them."""
    out: list[Trajectory] = []
    trajectories: list[Trajectory] = []
    for trajectory in episode.trajectories:
        if trajectory.role != role or len(trajectory.steps) <= 1:
            trajectories.append(trajectory)
            if trajectory.role == role:
                out.append(trajectory)
            continue
        for step in trajectory.steps:
            step.done = True
            piece = Trajectory(
                role=role, steps=[step], metadata={**trajectory.metadata, "split_from": trajectory.id}
            )
            trajectories.append(piece)
            out.append(piece)
    episode.trajectories = trajectories
    return out


def v1_credit(
    episode: Episode,
    correct: Sequence[bool],
    *,
    generate_role: str = "generate",
    verify_role: str = "verify",
) -> V1Credit:
    """Reward every generation and verification call of a V1 episode given each candidate's
    correctness (in the order of ``artifacts["v1"]["candidates"]``); return rewards and signals.

    Raises ValueError when the episode carries no V1 artifacts or ``correct`` has the wrong length.
    """
    v1 = episode.artifacts.get("v1")
    if not isinstance(v1, dict) or "candidates" not in v1:
        raise InputError("episode.artifacts['v1'] is missing: the flow must return V1Outcome.artifacts()")
    candidates: list[str] = v1["candidates"]
    if len(correct) != len(candidates):
        raise InputError(f"correct has {len(correct)} values for {len(candidates)} candidates")
    credit = V1Credit()
    unmatched = 0
    by_text = {text: i for i, text in enumerate(candidates)}
    for piece in split_role(episode, generate_role):
        text = _output_text(piece)
        i = None if text is None else by_text.get(text)
        unmatched += i is None
        credit.trajectory_rewards[piece.id] = float(i is not None and correct[i])

    pairs = {k: tuple(v) for k, v in v1.get("pairs_by_key", {}).items()}
    mixed = right = 0
    for piece in split_role(episode, verify_role):
        pair = pairs.get(prompt_key(piece.steps[0].input)) if piece.steps else None
        if pair is None:
            unmatched += 1
            credit.trajectory_rewards[piece.id] = 0.0
            continue
        first, second = pair
        if correct[first] == correct[second]:
            piece.role = verify_role + NO_SIGNAL_SUFFIX
            piece.metadata["v1_no_signal"] = True
            credit.trajectory_rewards[piece.id] = 0.0
            continue
        wanted = Verdict.A if correct[first] else Verdict.B
        hit = parse_verdict(_output_text(piece)) is wanted
        mixed += 1
        right += hit
        credit.trajectory_rewards[piece.id] = float(hit)

    credit.winner_correct = bool(correct[v1["winner"]])
    report = {
        "winner_correct": float(credit.winner_correct),
        "majority_correct": float(correct[v1["majority_winner"]]),
        "random_correct": sum(map(bool, correct)) / len(correct),  # expected accuracy of a random pick
        "pass_at_n": float(any(correct)),
        "verify_calls": float(v1.get("verify_calls", 0)),
        "verify_unparsed": float(v1.get("unparsed", 0)),
        "verify_mixed_pairs": float(mixed),
        "unmatched_calls": float(unmatched),
    }
    if mixed:
        report["verify_mixed_accuracy"] = right / mixed
    credit.signals = [Signal(name=f"v1/{name}", value=value) for name, value in report.items()]
    return credit


def _output_text(trajectory: Trajectory) -> str | None:
    step = trajectory.steps[-1] if trajectory.steps else None
    return None if step is None or step.output is None else step.output.text


def report_keys() -> tuple[str, ...]:
    """The signal names :func:`v1_credit` reports (``v1/...``), for dashboards and tests."""
    names = ("winner_correct", "majority_correct", "random_correct", "pass_at_n", "verify_calls")
    return tuple(f"v1/{n}" for n in names)
