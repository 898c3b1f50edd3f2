"""The probe set behind ``weights_stale``: does the sampler serve the weights the trainer trains?

At the first step, before its update, a few of the step's own model calls (the shortest, of
different tasks: ``health.probe_sequences`` of them, each a prompt and the completion sampled for
it) are fixed as the probe set and scored by the sampler. After an update and its weight sync the
sampler scores them again (vLLM's ``prompt_logprobs``, as a distillation teacher is asked:
``rllm.engine.data.distill.TeacherClient``), and the step records ``probe/logprob_change``, the
largest change of any token's logprob since the last scoring. An update that moved the weights
moves these logprobs; a sampler that keeps serving the old weights (a weight sync that does not
load them) leaves them exactly where they were.

When (``ProbeSchedule``): after each of the first ``STALE_UPDATES`` updates (so a run whose
weights never reach the sampler is named at step ``STALE_UPDATES``, whatever the timings), then
every ``k`` updates, ``k = probe_interval(probe cost, step time)``: the smallest interval that keeps
the probe's median cost within ``PROBE_BUDGET`` (2%) of the median step (its other work, the last
``TIMING_WINDOW`` steps), at most ``health.probe_max_interval``. A probe compares with the one
before it, so it covers every update since; ``weights_stale`` counts updates, not probes, and names
a sync that stops working at step ``s`` by step ``s + 2k - 1`` at the latest. The interval is set by
timings: which steps carry ``probe/logprob_change`` can differ between two runs of one seed
(``time/probe_interval`` records the interval in force).

Cost: one request to the sampler's own URL (not through the gateway), one forward pass over the
probe set's few hundred tokens, no generation, awaited after the weight sync: about 20 ms on the
2-core machine, 1.7% of a 1.2 s main-job step if probed every step but 11% of a 0.18 s
whole_system.py step, which the interval brings to about 2% (benchmarks/health_overhead.py);
``health.probe_sequences = 0`` turns it off. A sampler that does not answer ``prompt_logprobs``
turns the check off for the run, said in one line.

Several policies (rllm.engine.training.policies): each policy has its own probe set (its own
roles' calls), scored under its own model name (its adapter's sampler), on its own schedule,
after the updates that trained it; the step records ``policy/NAME/probe/logprob_change`` for
each policy probed and, as ``probe/logprob_change``, the least of them, so one adapter whose sync
does not load its weights is stale for the run (``weights_stale`` names the policy).
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence

from rllm.engine.data.distill import TeacherClient
from rllm.engine.training.health_checks import STALE_UPDATES
from rllm.types import Episode, Trajectory
from rllm.types.errors import RLLMError

PROBE_MAX_TOKENS = 2048  # a longer call is never a probe (the probe must stay cheap)
PROBE_TIMEOUT_S = 60.0
PROBE_BUDGET = 0.02  # the share of a step the probe may cost, averaged over its interval
TIMING_WINDOW = 8  # the last this many steps and probes give the medians the interval is set from


class ProbeUnavailable(RLLMError):
    """The sampler cannot score the probe set (no ``prompt_logprobs``, or unreachable)."""


def choose_probes(
    episodes: Sequence[Episode], count: int, keep: Callable[[Trajectory], bool] | None = None
) -> list[list[int]]:
    """Up to ``count`` token sequences (prompt + completion) of the step's calls: the shortest
    call of each task, shortest first, each at most PROBE_MAX_TOKENS (of the trajectories
    ``keep`` keeps, when given: one policy's, where several train)."""
    by_task: dict[str, list[int]] = {}
    for episode in episodes:
        for trajectory in episode.trajectories:
            if keep is not None and not keep(trajectory):
                continue
            for step in trajectory.steps:
                if step.prompt_ids is None or step.completion_ids is None or not len(step.completion_ids):
                    continue
                ids = [int(t) for t in step.prompt_ids] + [int(t) for t in step.completion_ids]
                shortest = by_task.get(episode.task_id)
                if len(ids) <= PROBE_MAX_TOKENS and (shortest is None or len(ids) < len(shortest)):
                    by_task[episode.task_id] = ids
    return sorted(by_task.values(), key=len)[:count]


def probe_interval(probe_s: float, step_s: float, max_interval: int, budget: float = PROBE_BUDGET) -> int:
    """Updates between two probes: the fewest that keep a probe of ``probe_s`` seconds within
    ``budget`` of steps of ``step_s`` seconds (their work without the probe), from 1 (a probe
    cheap enough runs every update) to ``max_interval``."""
    if probe_s <= 0.0:
        return 1
    if step_s <= 0.0:
        return max_interval
    # (less a rounding error: a probe at exactly the budget is within it)
    return max(1, min(max_interval, math.ceil(probe_s / (budget * step_s) - 1e-9)))


class ProbeSchedule:
    """Which updates the probe set is re-scored after: each of the first ``warmup``, then every
    ``interval`` (``probe_interval`` of the median probe and step times recorded so far; 1 until
    both are known)."""

    def __init__(self, max_interval: int, warmup: int = STALE_UPDATES) -> None:
        self.max_interval, self.warmup = max_interval, warmup
        self.probes = 0  # re-scorings after an update so far
        self.since = 0  # updates since the last re-scoring
        self.step_s: deque[float] = deque(maxlen=TIMING_WINDOW)
        self.probe_s: deque[float] = deque(maxlen=TIMING_WINDOW)

    @property
    def interval(self) -> int:
        if not self.step_s or not self.probe_s:
            return 1
        return probe_interval(
            statistics.median(self.probe_s), statistics.median(self.step_s), self.max_interval
        )

    def step_took(self, seconds: float) -> None:
        """A step's wall time, its probe left out."""
        self.step_s.append(max(0.0, seconds))

    def probe_took(self, seconds: float) -> None:
        self.probe_s.append(seconds)

    def after_update(self) -> bool:
        """An update was published: whether the probe set is re-scored now."""
        self.since += 1
        if self.probes < self.warmup or self.since >= self.interval:
            self.probes += 1
            self.since = 0
            return True
        return False


class WeightProbe:
    """Scores the probe set on the sampler; ``measure`` returns the change since the last time.
    ``schedule`` says after which updates (``due``), from the step times ``step_began`` sees."""

    def __init__(
        self, count: int, url: Callable[[], str], model: Callable[[], str], max_interval: int = 1
    ) -> None:
        self.count = count
        self._url, self._model = url, model  # asked at each scoring: a backend may rename its model
        self.probes: list[list[int]] = []
        self.last: list[list[float]] | None = None
        self.schedule = ProbeSchedule(max_interval)
        self._step_began: float | None = None
        self._probe_s = 0.0  # the probe's seconds in the current step

    def step_began(self) -> None:
        """A step starts: the one before it took from its start to now, its probe left out."""
        now = time.perf_counter()
        if self._step_began is not None:
            self.schedule.step_took(now - self._step_began - self._probe_s)
        self._step_began, self._probe_s = now, 0.0

    def due(self) -> bool:
        """An update was published: whether to ``measure`` now."""
        return self.schedule.after_update()

    @property
    def chosen(self) -> bool:
        return bool(self.probes)

    async def start(
        self, episodes: Sequence[Episode], keep: Callable[[Trajectory], bool] | None = None
    ) -> bool:
        """Fix the probe set from the first step's episodes (their trajectories ``keep`` keeps)
        and score it (before the update); False when the step holds no call to probe with."""
        self.probes = choose_probes(episodes, self.count, keep)
        if not self.probes:
            return False
        self.last = await self._score()
        return True

    async def measure(self) -> float:
        """The largest |change| of a probe token's logprob since the last scoring."""
        scores = await self._score()
        previous, self.last = self.last, scores
        assert previous is not None, "start() scores the probe set first"
        return max(
            (
                abs(a - b)
                for old, new in zip(previous, scores, strict=True)
                for a, b in zip(old[1:], new[1:], strict=True)
            ),
            default=0.0,
        )

    async def _score(self) -> list[list[float]]:
        client = TeacherClient(self._url(), self._model(), PROBE_TIMEOUT_S)
        started = time.perf_counter()
        try:
            scores = await asyncio.to_thread(client.score_batch_sync, self.probes)
            took = time.perf_counter() - started
            self._probe_s += took
            self.schedule.probe_took(took)
            return scores
        except (RLLMError, ConnectionError, ValueError) as exc:
            raise ProbeUnavailable(
                f"the sampler at {client.url} did not score the probe set (vLLM's prompt_logprobs): {exc}"
            ) from None
