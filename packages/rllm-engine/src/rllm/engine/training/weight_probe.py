"""The probe set behind ``weights_stale``: does the sampler serve the weights the trainer trains?

At the first step, before its update, a few of the step's own model calls (the shortest, of
different tasks: ``health.probe_sequences`` of them, each a prompt and the completion sampled for
it) are fixed as the probe set and scored by the sampler. After every update and weight sync the
sampler scores them again (vLLM's ``prompt_logprobs``, as a distillation teacher is asked:
``rllm.engine.data.distill.TeacherClient``), and the step records ``probe/logprob_change``, the
largest change of any token's logprob since the last scoring. An update that moved the weights
moves these logprobs; a sampler that keeps serving the old weights (a weight sync that does not
load them) leaves them exactly where they were.

Cost: one request a step to the sampler's own URL (not through the gateway), one forward pass
over the probe set's few hundred tokens, no generation, awaited after the weight sync: 28 ms of
a 2.0 s main-job step (1.4%) and 35 ms of a 0.34 s whole_system.py step (10%, over the 3% target)
on the 2-core machine at load 23 (benchmarks/health_overhead.py); ``health.probe_sequences = 0``
turns it off.
A sampler that does not answer ``prompt_logprobs`` turns the check off for the run, said in one line.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from rllm.engine.data.distill import TeacherClient
from rllm.types import Episode
from rllm.types.errors import RLLMError

PROBE_MAX_TOKENS = 2048  # a longer call is never a probe (the probe must stay cheap)
PROBE_TIMEOUT_S = 60.0


class ProbeUnavailable(RLLMError):
    """The sampler cannot score the probe set (no ``prompt_logprobs``, or unreachable)."""


def choose_probes(episodes: Sequence[Episode], count: int) -> list[list[int]]:
    """Up to ``count`` token sequences (prompt + completion) of the step's calls: the shortest
    call of each task, shortest first, each at most PROBE_MAX_TOKENS."""
    by_task: dict[str, list[int]] = {}
    for episode in episodes:
        for trajectory in episode.trajectories:
            for step in trajectory.steps:
                if step.prompt_ids is None or step.completion_ids is None or not len(step.completion_ids):
                    continue
                ids = [int(t) for t in step.prompt_ids] + [int(t) for t in step.completion_ids]
                shortest = by_task.get(episode.task_id)
                if len(ids) <= PROBE_MAX_TOKENS and (shortest is None or len(ids) < len(shortest)):
                    by_task[episode.task_id] = ids
    return sorted(by_task.values(), key=len)[:count]


class WeightProbe:
    """Scores the probe set on the sampler; ``measure`` returns the change since the last time."""

    def __init__(self, count: int, url: Callable[[], str], model: Callable[[], str]) -> None:
        self.count = count
        self._url, self._model = url, model  # asked at each scoring: a backend may rename its model
        self.probes: list[list[int]] = []
        self.last: list[list[float]] | None = None

    @property
    def chosen(self) -> bool:
        return bool(self.probes)

    async def start(self, episodes: Sequence[Episode]) -> bool:
        """Fix the probe set from the first step's episodes and score it (before the update);
        False when the step holds no call to probe with."""
        self.probes = choose_probes(episodes, self.count)
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
        try:
            return await asyncio.to_thread(client.score_batch_sync, self.probes)
        except (RLLMError, ConnectionError, ValueError) as exc:
            raise ProbeUnavailable(
                f"the sampler at {client.url} did not score the probe set (vLLM's prompt_logprobs): {exc}"
            ) from None
