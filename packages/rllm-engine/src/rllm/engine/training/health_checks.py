"""The training-health checks: each judges one failure mode from the metrics rows of a run, one
step at a time, and says what it saw (the evidence: steps and values) and its likely cause.

A check reads only a step's metrics row (``metrics.jsonl``), so the live run
(``rllm.engine.training.health``) and ``rllm doctor run`` over a run folder judge alike. What a row
needs beyond the trainer's own metrics, the step measures (``health_measure``: ``tokens/entropy_proxy``,
``tokens/truncated_share``, ``filter/no_signal_groups``; ``weight_probe``: ``probe/logprob_change``).

``observe`` returns None when the row holds nothing to judge (a backend that reports no learning
rate, a step without validation), else a Verdict: whether the failure's condition holds now and,
when it does, the evidence. A condition that must hold for several steps counts them itself.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Mapping
from itertools import pairwise
from typing import Any, ClassVar, NamedTuple

from rllm.engine.training.health_config import HealthSection

PROBE_EPSILON = 1e-5  # nats: a probe logprob that moved less than this did not move
STALE_UPDATES = 2  # updates in a row that leave the probe set unchanged (probed or not)
LR_ZERO_STEPS = 2  # a warmup may start at 0 for one step
NO_LEARNING_STEPS = 3  # consecutive steps without a learning signal
GRAD_ZERO_STEPS = 2
LENGTH_RISE = 0.25  # the truncated share's rise over its lowest window that counts as a blow-up
HACK_POINTS = 3  # validation points a fall is judged over
HACK_FALL = 0.1  # of the reward range: validation's fall over those points
HACK_RISE = 0.05  # of the reward range: train reward's rise over them
CREEP_RATIO = 1.5  # the window's second half against its first
FORMAT_FALL = 0.2  # a format signal's fall from its best window
REWARD_HOLDS = 0.05  # of the reward range: how far the reward may fall and still "hold"


class Verdict(NamedTuple):
    firing: bool
    evidence: str = ""


def number(row: Mapping[str, Any], key: str) -> float | None:
    """``row[key]`` when it is a finite number (not a bool), else None."""
    value = row.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _span(first: int, last: int) -> str:
    return f"step {last}" if first == last else f"steps {first}-{last}"


class Check:
    """One failure mode. Subclasses set ``name`` (a key of ``health_config.CHECKS``) and
    ``cause`` (the likely cause and what to try, one sentence) and implement ``observe``."""

    name: ClassVar[str]
    cause: ClassVar[str]

    def __init__(self, section: HealthSection, max_mismatch: float | None = None) -> None:
        self.section = section
        self.max_mismatch = max_mismatch
        self.window = section.window
        self.span = section.reward_ceiling - section.reward_floor

    def observe(self, step: int, row: Mapping[str, Any]) -> Verdict | None:
        raise NotImplementedError


class Streak:
    """Steps in a row a condition held: their first step and the values seen."""

    def __init__(self) -> None:
        self.first = 0
        self.values: list[float] = []

    def hold(self, step: int, value: float) -> int:
        if not self.values:
            self.first = step
        self.values.append(value)
        return len(self.values)

    def reset(self) -> None:
        self.values = []


class WeightsStale(Check):
    """Updates that moved the trainer's weights and left the probe set unchanged, counted in a row.

    A probe covers every update since the one before it (``weight_probe.ProbeSchedule`` skips
    steps when the probe would cost more than its share of a step), so the updates that moved the
    weights are counted on every row and charged to the next probed row."""

    name = "weights_stale"
    cause = (
        "the sampler is not serving the trained weights: its weight sync does not load them (an "
        "adapter not reloaded, a sync to another model), or every update is below the weights' "
        "precision (a tiny learning rate in bf16); compare the backend's sync_weights with its sampler"
    )

    def __init__(self, section: HealthSection, max_mismatch: float | None = None) -> None:
        super().__init__(section, max_mismatch)
        self.streak = Streak()  # the probes in a row that saw no change
        self.stale = 0  # the updates they cover
        self.moved = 0  # updates that moved the weights since the last probe
        self.moved_first = 0  # the first of them
        self.last_detail = ""

    def observe(self, step: int, row: Mapping[str, Any]) -> Verdict | None:
        lr, grad = number(row, "train/lr"), number(row, "train/grad_norm")
        if (number(row, "train/signal_sequences") or 0) > 0 and lr != 0 and grad != 0:
            if not self.moved:
                self.moved_first = step
            self.moved += 1
            self.last_detail = f"lr {lr:g}, " if lr is not None else ""
            self.last_detail += f"grad norm {grad:.3g}" if grad is not None else "nonzero advantages"
        change = number(row, "probe/logprob_change")
        if change is None:
            return None
        covered, self.moved = self.moved, 0
        if not covered:  # nothing should have changed: neither evidence for nor against
            return Verdict(False)
        if change > PROBE_EPSILON:
            self.streak.reset()
            self.stale = 0
            return Verdict(False)
        if not self.streak.values:
            self.streak.hold(self.moved_first, change)
        else:
            self.streak.hold(step, change)
        self.stale += covered
        if self.stale < STALE_UPDATES:
            return Verdict(False)
        # Several policies: the ones whose probe set did not move (the row's least change is the run's).
        stale = [
            key.split("/")[1]
            for key in row
            if key.startswith("policy/")
            and key.endswith("/probe/logprob_change")
            and (number(row, key) or 0.0) <= PROBE_EPSILON
        ]
        whose = f"policy {', '.join(repr(name) for name in stale)}: " if stale else ""
        return Verdict(
            True,
            f"{whose}the sampler's logprobs of the probe set moved at most {max(self.streak.values):.1e} nats "
            f"over the {self.stale} updates of {_span(self.streak.first, step)} ({self.last_detail})",
        )


class CountedZero(Check):
    """A number that must not stay at 0 for ``steps`` steps in a row while it matters."""

    key: ClassVar[str]
    steps: ClassVar[int]

    def __init__(self, section: HealthSection, max_mismatch: float | None = None) -> None:
        super().__init__(section, max_mismatch)
        self.streak = Streak()

    def applies(self, row: Mapping[str, Any]) -> bool:
        return True

    def observe(self, step: int, row: Mapping[str, Any]) -> Verdict | None:
        value = number(row, self.key)
        if value is None or not self.applies(row):
            return None
        if value != 0:
            self.streak.reset()
            return Verdict(False)
        held = self.streak.hold(step, value)
        return (
            Verdict(True, self.evidence(self.streak.first, step, row))
            if held >= self.steps
            else Verdict(False)
        )

    def evidence(self, first: int, step: int, row: Mapping[str, Any]) -> str:
        raise NotImplementedError


class LrZero(CountedZero):
    name = "lr_zero"
    key, steps = "train/lr", LR_ZERO_STEPS
    cause = (
        "the learning-rate schedule is at 0 (a warmup that starts at 0 and never rises, a schedule "
        "past its end, a scale of 0), so no update moves the weights: check the schedule and "
        "backend.options.learning_rate"
    )

    def applies(self, row: Mapping[str, Any]) -> bool:
        return (number(row, "train/sequences") or 0) > 0

    def evidence(self, first: int, step: int, row: Mapping[str, Any]) -> str:
        return f"train/lr was 0 at {_span(first, step)} while {row.get('train/sequences')} sequences trained"


class ZeroAdvantage(CountedZero):
    name = "zero_advantage"
    key, steps = "train/signal_sequences", NO_LEARNING_STEPS
    cause = (
        "every group was filtered out, or all rollouts of each task got the same reward, so the model "
        "learns nothing. Try a larger group_size, a higher rollout.sampling.temperature, a stronger or "
        "better-suited model (backend.options.model), or an easier task; `rllm view` shows the episodes"
    )

    def evidence(self, first: int, step: int, row: Mapping[str, Any]) -> str:
        return (
            f"no learning signal in {step - first + 1} steps in a row ({_span(first, step)}): no trained "
            "sequence had a nonzero advantage"
        )


class GradZero(CountedZero):
    name = "grad_zero"
    key, steps = "train/grad_norm", GRAD_ZERO_STEPS
    cause = (
        "the loss has no gradient though advantages are nonzero: every trained token masked out, a "
        "loss detached from the weights, or no trainable parameter (LoRA target_modules matching none)"
    )

    def applies(self, row: Mapping[str, Any]) -> bool:
        return (number(row, "train/signal_sequences") or 0) > 0

    def evidence(self, first: int, step: int, row: Mapping[str, Any]) -> str:
        return (
            f"train/grad_norm was 0 at {_span(first, step)} while "
            f"{row.get('train/signal_sequences')} sequences had nonzero advantages"
        )


class EntropyCollapse(Check):
    name = "entropy_collapse"
    cause = (
        "the policy has collapsed onto a few answers and no longer explores the ones it misses: "
        "raise rollout.sampling.temperature, add algorithm.entropy_coef, or lower the learning rate"
    )

    def __init__(self, section: HealthSection, max_mismatch: float | None = None) -> None:
        super().__init__(section, max_mismatch)
        self.streak = Streak()
        self.rewards: list[float] = []

    def observe(self, step: int, row: Mapping[str, Any]) -> Verdict | None:
        entropy = number(row, "tokens/entropy_proxy")
        entropy = number(row, "train/entropy") if entropy is None else entropy
        reward = number(row, "reward/mean")
        if entropy is None or reward is None:
            return None
        near_ceiling = reward >= self.section.reward_floor + 0.9 * self.span
        if entropy >= self.section.entropy_floor or near_ceiling:
            self.streak.reset()
            self.rewards = []
            return Verdict(False)
        self.rewards.append(reward)
        if self.streak.hold(step, entropy) < max(2, self.window // 2):
            return Verdict(False)
        return Verdict(
            True,
            f"token entropy {max(self.streak.values):.3f} nats or less (floor {self.section.entropy_floor}) "
            f"at {_span(self.streak.first, step)} while the reward stayed at "
            f"{statistics.fmean(self.rewards):.2f}, below its ceiling {self.section.reward_ceiling:g}",
        )


class Rolling:
    """The mean of the last ``size`` values, once there are that many."""

    def __init__(self, size: int) -> None:
        self.values: deque[tuple[int, float]] = deque(maxlen=size)

    def add(self, step: int, value: float) -> float | None:
        self.values.append((step, value))
        if len(self.values) < (self.values.maxlen or 0):
            return None
        return statistics.fmean(v for _, v in self.values)

    @property
    def first(self) -> int:
        return self.values[0][0]


class LengthBlowup(Check):
    name = "length_blowup"
    cause = (
        "responses grow until they hit the limit: the reward pays for length (or for something long "
        "answers hit more often), and cut answers train like finished ones; check what the evaluator "
        "pays for, add a length penalty, or lower max_tokens"
    )

    def __init__(self, section: HealthSection, max_mismatch: float | None = None) -> None:
        super().__init__(section, max_mismatch)
        self.rolling = Rolling(self.window)
        self.lowest: tuple[float, int, int] | None = None  # mean, first step, last step

    def observe(self, step: int, row: Mapping[str, Any]) -> Verdict | None:
        share = number(row, "tokens/truncated_share")
        if share is None:
            return None
        mean = self.rolling.add(step, share)
        if mean is None:
            return Verdict(False)
        if self.lowest is None or mean < self.lowest[0]:
            self.lowest = (mean, self.rolling.first, step)
        low, low_first, low_last = self.lowest
        if mean < self.section.truncated_share or mean - low < LENGTH_RISE:
            return Verdict(False)
        tokens = number(row, "tokens/response_mean")
        length = f"; {tokens:.0f} tokens a response at step {step}" if tokens is not None else ""
        return Verdict(
            True,
            f"{mean:.0%} of completions were cut at max_tokens over {_span(self.rolling.first, step)}, "
            f"up from {low:.0%} over {_span(low_first, low_last)}{length}",
        )


class RewardHacking(Check):
    name = "reward_hacking"
    cause = (
        "the policy learns something the evaluator pays for on the training tasks that does not carry "
        "over: an exploitable evaluator (reward hacking) or overfitting; read the newest samples "
        "(`rllm view`) and harden the evaluator"
    )

    def __init__(self, section: HealthSection, max_mismatch: float | None = None) -> None:
        super().__init__(section, max_mismatch)
        self.train: list[float] = []  # train rewards since the last validation
        self.points: list[tuple[int, float, float]] = []  # (step, validation, train mean)

    def observe(self, step: int, row: Mapping[str, Any]) -> Verdict | None:
        reward = number(row, "reward/mean")
        if reward is not None and number(row, "episodes") != 0:
            self.train.append(reward)
        val = number(row, "val/reward/mean")
        if val is None:
            return None
        if self.train:  # the step-0 validation has no train reward to compare with
            self.points.append((step, val, statistics.fmean(self.train)))
            self.train = []
        last = self.points[-HACK_POINTS:]
        if len(last) < HACK_POINTS:
            return Verdict(False)
        vals, trains = [p[1] for p in last], [p[2] for p in last]
        falling = all(b <= a for a, b in pairwise(vals)) and vals[0] - vals[-1] >= HACK_FALL * self.span
        rising = trains[-1] - trains[0] >= HACK_RISE * self.span
        if not (falling and rising):
            return Verdict(False)
        steps = ", ".join(str(p[0]) for p in last)
        return Verdict(
            True,
            f"validation reward fell {' -> '.join(f'{v:.2f}' for v in vals)} (steps {steps}) while train "
            f"reward rose {' -> '.join(f'{t:.2f}' for t in trains)}",
        )


class NoSignal(Check):
    name = "no_signal"
    cause = (
        "the evaluator pays these tasks the same whatever the model does (a parse failure or a judge's "
        "default paying a fixed partial reward), so their rollouts train nothing: check the "
        "evaluator on them (`rllm view`), or raise group_size or the temperature"
    )

    def __init__(self, section: HealthSection, max_mismatch: float | None = None) -> None:
        super().__init__(section, max_mismatch)
        self.rolling = Rolling(self.window)

    def observe(self, step: int, row: Mapping[str, Any]) -> Verdict | None:
        share = number(row, "filter/no_signal_groups")
        if share is None:
            return None
        mean = self.rolling.add(step, share)
        if mean is None or mean < self.section.no_signal_share:
            return Verdict(False)
        reward = number(row, "filter/no_signal_reward")
        paid = f" (at step {step} they were paid {reward:.2f} on average)" if reward is not None else ""
        return Verdict(
            True,
            f"{mean:.0%} of the groups over {_span(self.rolling.first, step)} got one reward for every "
            f"rollout, between the floor {self.section.reward_floor:g} and the ceiling "
            f"{self.section.reward_ceiling:g}{paid}",
        )


class MismatchCreep(Check):
    name = "mismatch_creep"
    cause = (
        "the sampler and the trainer drift apart: a sampler serving older weights than it reports, a "
        "precision gap (bf16 sampler, fp32 trainer) that grows with the weights, or a template "
        "changing tokens (docs/token-truth.md)"
    )

    def __init__(self, section: HealthSection, max_mismatch: float | None = None) -> None:
        super().__init__(section, max_mismatch)
        self.values: deque[tuple[int, float]] = deque(maxlen=self.window)

    def observe(self, step: int, row: Mapping[str, Any]) -> Verdict | None:
        mismatch = number(row, "mismatch/mean_abs")
        if mismatch is None:
            return None
        self.values.append((step, mismatch))
        if len(self.values) < self.window:
            return Verdict(False)
        half = self.window // 2
        values = [v for _, v in self.values]
        before, after = statistics.fmean(values[:half]), statistics.fmean(values[half:])
        slope = _slope([s for s, _ in self.values], values)
        if after < self.section.mismatch_floor or after < CREEP_RATIO * before or slope <= 0:
            return Verdict(False)
        trips = ""
        if self.max_mismatch is not None and mismatch < self.max_mismatch:
            trips = (
                f"; at this rate it passes algorithm.max_mismatch={self.max_mismatch:g} in about "
                f"{math.ceil((self.max_mismatch - mismatch) / slope - 1e-9)} steps"
            )
        return Verdict(
            True,
            f"the mean |trainer - sampler| logprob rose from {before:.4f} to {after:.4f} nats over "
            f"{_span(self.values[0][0], step)}{trips}",
        )


def _slope(xs: list[int], ys: list[float]) -> float:
    """Least-squares slope of ys over xs."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / spread if spread else 0.0


class FormatDrift(Check):
    name = "format_drift"
    cause = (
        "the model drops the answer's format while the evaluator still pays for the answers, so a "
        "lenient parser is being learned around; check the evaluator or add a format term to the reward"
    )

    def __init__(self, section: HealthSection, max_mismatch: float | None = None) -> None:
        super().__init__(section, max_mismatch)
        self.signals: dict[str, Rolling] = {}
        self.rewards = Rolling(self.window)
        self.best: dict[str, tuple[float, float, int, int]] = {}  # signal mean, reward mean, steps

    def watches(self, key: str) -> bool:
        if not key.startswith("signal/"):
            return False
        name = key.removeprefix("signal/")
        if self.section.format_signal is not None:
            return name == self.section.format_signal
        return name.startswith("has_") or "format" in name

    def observe(self, step: int, row: Mapping[str, Any]) -> Verdict | None:
        keys = [k for k in row if self.watches(k) and number(row, k) is not None]
        reward_value = number(row, "reward/mean")
        if not keys or reward_value is None:
            return None
        reward = self.rewards.add(step, reward_value)
        found: list[str] = []
        for key in keys:
            rolling = self.signals.setdefault(key, Rolling(self.window))
            mean = rolling.add(step, number(row, key) or 0.0)
            if mean is None or reward is None:
                continue
            best = self.best.get(key)
            if best is None or mean > best[0]:
                self.best[key] = best = (mean, reward, rolling.first, step)
            holds = reward >= best[1] - REWARD_HOLDS * self.span
            if best[0] - mean >= FORMAT_FALL and holds:
                found.append(
                    f"{key} fell from {best[0]:.2f} ({_span(best[2], best[3])}) to {mean:.2f} "
                    f"({_span(rolling.first, step)}) while the reward held ({best[1]:.2f} -> {reward:.2f})"
                )
        return Verdict(bool(found), "; ".join(found))


CHECK_TYPES: tuple[type[Check], ...] = (
    WeightsStale,
    LrZero,
    ZeroAdvantage,
    GradZero,
    EntropyCollapse,
    LengthBlowup,
    RewardHacking,
    NoSignal,
    MismatchCreep,
    FormatDrift,
)
