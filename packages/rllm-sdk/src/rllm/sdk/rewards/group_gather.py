"""``GroupGather``: a group scorer (``score_group(task, episodes)``) as the engine's per-episode
evaluator.

The engine scores each rollout as it finishes, one episode at a time. A group judge needs the
whole group, so each episode's ``evaluate`` waits here until ``group_size`` episodes of its task
have arrived; the last one to arrive scores them all in one call and every waiter returns its own
verdict. Rollouts of one group must therefore run in one process at once: ``rollout.executor =
"local"`` and ``rollout.concurrency >= group_size`` (a worker holds its concurrency slot while its
episode waits).

A sibling may never arrive: a rollout that failed (agent error, timeout) is not evaluated. After
``gather_timeout_s`` from a group's first arrival its members are scored as they are (a smaller
group), each reporting ``judge/partial_group = 1``; keep it below the engine's
``rollout.eval_timeout_s`` (300 s by default), which bounds each evaluator call. A validation
episode (``episode.artifacts["is_validation"]``, which a flow sets from ``config.is_validation``;
validation runs one rollout per task) is scored alone at once.

A ``rollout_index`` at or beyond ``group_size`` (the run's groups are larger than the judge was
told) is refused (``UsageError``, the episode's ``eval_error``), never judged in slices.

The same task in flight twice (an epoch boundary under asynchronous training) fills a second
group: an episode joins the first open group of its task that lacks its ``rollout_index``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rllm.types import Episode, EvalOutput, Signal, Task
from rllm.types.errors import InputError, UsageError


class GroupScorer(Protocol):
    def score_group(self, task: Task, episodes: Sequence[Episode]) -> Awaitable[list[EvalOutput]]: ...


@dataclass
class _Group:
    task: Task
    opened: float
    episodes: list[Episode] = field(default_factory=list)
    verdicts: list[asyncio.Future[EvalOutput]] = field(default_factory=list)
    closed: bool = False

    def has(self, rollout_index: int) -> bool:
        return any(e.rollout_index == rollout_index for e in self.episodes)


class GroupGather:
    """Evaluator holding episodes until their group of ``group_size`` is complete, then scoring
    the group with ``scorer.score_group`` (e.g. a :class:`~rllm.sdk.rewards.GroupJudge`)."""

    def __init__(self, scorer: GroupScorer, group_size: int, *, gather_timeout_s: float = 240.0) -> None:
        if group_size < 1:
            raise InputError(f"GroupGather needs group_size >= 1, got {group_size}")
        if gather_timeout_s <= 0:
            raise InputError(f"GroupGather needs gather_timeout_s > 0, got {gather_timeout_s}")
        self.scorer = scorer
        self.group_size = group_size
        self.gather_timeout_s = gather_timeout_s
        self._open: dict[str, list[_Group]] = {}
        self.partial_groups = 0  # groups scored short of group_size (for tests and benchmarks)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_open"] = {}  # futures belong to this process's loop
        return state

    async def evaluate(self, task: Task, episode: Episode) -> EvalOutput:
        if episode.artifacts.get("is_validation") is True or self.group_size == 1:
            return (await self.scorer.score_group(task, [episode]))[0]
        if episode.rollout_index >= self.group_size:
            # The run's groups are larger than this gatherer's: judging them in slices would
            # rank each slice on its own, silently.
            raise UsageError(
                f"rollout {episode.rollout_index} of task {task.id!r} is beyond a group of {self.group_size}: "
                "set the judge's group size to the run's group_size"
            )
        group, verdict = self._join(task, episode)
        if len(group.episodes) == self.group_size:
            await self._score(group, partial=False)
            return verdict.result()
        remaining = group.opened + self.gather_timeout_s - time.monotonic()
        try:
            return await asyncio.wait_for(asyncio.shield(verdict), max(0.0, remaining))
        except TimeoutError:
            if not group.closed:  # the first waiter to give up scores whoever arrived
                await self._score(group, partial=True)
            return await verdict

    def _join(self, task: Task, episode: Episode) -> tuple[_Group, asyncio.Future[EvalOutput]]:
        groups = self._open.setdefault(task.id, [])
        group = next((g for g in groups if not g.has(episode.rollout_index)), None)
        if group is None:
            group = _Group(task=task, opened=time.monotonic())
            groups.append(group)
        verdict: asyncio.Future[EvalOutput] = asyncio.get_running_loop().create_future()
        group.episodes.append(episode)
        group.verdicts.append(verdict)
        return group, verdict

    async def _score(self, group: _Group, *, partial: bool) -> None:
        group.closed = True
        groups = self._open.get(group.task.id, [])
        if group in groups:
            groups.remove(group)
        if not groups:
            self._open.pop(group.task.id, None)
        if partial:
            self.partial_groups += 1
        try:
            outputs = await self.scorer.score_group(group.task, list(group.episodes))
            if len(outputs) != len(group.episodes):
                raise InputError(
                    f"score_group returned {len(outputs)} verdicts for {len(group.episodes)} episodes"
                )
        except BaseException as exc:
            for verdict in group.verdicts:
                if not verdict.done():
                    verdict.set_exception(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        for verdict, output in zip(group.verdicts, outputs, strict=True):
            if partial:
                output.signals.append(Signal(name="judge/partial_group", value=1.0))
            if not verdict.done():
                verdict.set_result(output)
