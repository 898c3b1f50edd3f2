"""``health.*``: which training-health checks run, which stop the run, and their thresholds.

The checks themselves are ``rllm.engine.training.health_checks``; the monitor that runs them each
step (and ``rllm doctor run`` over a run folder) is ``rllm.engine.training.health``. A name that
is not a check is refused here, before anything starts, listing the known ones.
"""

from __future__ import annotations

import math

import msgspec

from rllm.types.errors import InvariantError

# Every check, in the order the monitor runs them and reports them, with what it watches.
CHECKS: dict[str, str] = {
    "weights_stale": "the sampler's logprobs of a fixed probe set do not change after updates",
    "lr_zero": "the learning rate is 0 while sequences train",
    "zero_advantage": "no trained sequence had a nonzero advantage, steps in a row",
    "grad_zero": "the gradient norm is 0 while advantages are nonzero",
    "entropy_collapse": "token entropy under a floor while the reward is below its ceiling",
    "length_blowup": "the share of completions cut at max_tokens rising",
    "reward_hacking": "train reward rising while validation reward falls",
    "no_signal": "groups whose rollouts all got one middling reward, over a window",
    "mismatch_creep": "the train/sampler logprob mismatch trending up",
    "format_drift": "a format signal of the evaluator falling while the reward holds",
}


class HealthSection(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """TrainerConfig's ``health``: every check runs unless named in ``off``; a check named in
    ``stop_on`` stops the run (exit 3) the step it fires.

    ``window``: steps a trend is judged over. ``probe_sequences``: how many (prompt, completion)
    pairs of the first step the sampler re-scores after updates for ``weights_stale`` (one
    ``prompt_logprobs`` request each time; 0 turns the check off). ``probe_max_interval``: the
    most updates between two re-scorings; the probe runs after each of the first two updates, then
    as seldom as keeps it within 2% of a step, up to this (``weight_probe.ProbeSchedule``; 1: after
    every update). A sync that stops working is named within ``2 * probe_max_interval`` updates. ``reward_floor`` and
    ``reward_ceiling`` bound the evaluator's reward (rLLM's evaluators pay 0 to 1): a group all at
    the floor is unrewarded, all at the ceiling is solved, and neither is a ``no_signal`` group.
    ``entropy_floor``: nats per token under which the policy counts as collapsed.
    ``truncated_share``: the share of completions cut at ``max_tokens`` above which a rise is a
    blow-up. ``no_signal_share``: the share of no-signal groups over a window that fires.
    ``mismatch_floor``: mean |trainer - sampler| logprob (nats) under which a rise is numerics.
    ``format_signal``: the evaluator signal that measures format (``has_boxed``); None watches
    every signal named ``has_*`` or ``*format*``.
    """

    stop_on: list[str] = msgspec.field(default_factory=list)
    off: list[str] = msgspec.field(default_factory=list)
    window: int = 10
    probe_sequences: int = 4
    probe_max_interval: int = 8
    reward_floor: float = 0.0
    reward_ceiling: float = 1.0
    entropy_floor: float = 0.05
    truncated_share: float = 0.5
    no_signal_share: float = 0.5
    mismatch_floor: float = 0.02
    format_signal: str | None = None

    def __post_init__(self) -> None:
        for key in ("stop_on", "off"):
            unknown = [name for name in getattr(self, key) if name not in CHECKS]
            if unknown:
                raise InvariantError(
                    f"unknown health check {', '.join(map(repr, unknown))}; the checks are: "
                    f"{', '.join(CHECKS)}",
                    key,
                )
        both = [name for name in self.stop_on if name in self.off]
        if both:
            raise InvariantError(
                f"{', '.join(both)} is turned off (health.off), so it cannot stop the run", "stop_on"
            )
        if "weights_stale" in self.stop_on and self.probe_sequences == 0:
            raise InvariantError("weights_stale needs the probe set: health.probe_sequences is 0", "stop_on")
        if self.window < 2:
            raise InvariantError(f"window must be >= 2 steps, got {self.window}", "window")
        if self.probe_sequences < 0:
            raise InvariantError(
                f"probe_sequences must be >= 0, got {self.probe_sequences}", "probe_sequences"
            )
        if self.probe_max_interval < 1:
            raise InvariantError(
                f"probe_max_interval must be >= 1 update, got {self.probe_max_interval}", "probe_max_interval"
            )
        if not (math.isfinite(self.reward_floor) and math.isfinite(self.reward_ceiling)) or (
            self.reward_floor >= self.reward_ceiling
        ):
            raise InvariantError(
                f"reward_floor ({self.reward_floor}) must be below reward_ceiling ({self.reward_ceiling})",
                "reward_ceiling",
            )
        for key in ("truncated_share", "no_signal_share"):
            if not 0.0 < getattr(self, key) <= 1.0:
                raise InvariantError(f"{key} must be in (0, 1], got {getattr(self, key)}", key)
        for key in ("entropy_floor", "mismatch_floor"):
            if not getattr(self, key) >= 0.0:
                raise InvariantError(f"{key} must be >= 0, got {getattr(self, key)}", key)

    def runs(self, name: str) -> bool:
        return name not in self.off and not (name == "weights_stale" and self.probe_sequences == 0)
