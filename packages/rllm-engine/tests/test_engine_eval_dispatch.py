"""Sync evaluators: in the thread pool until proven cheap, then inline on the loop; a slow one
(or one that opts out) stays in the pool, and scoring's records are unchanged either way."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from rllm.engine.rollout import eval_dispatch
from rllm.engine.rollout.eval_dispatch import PROBATION_CALLS, EvalDispatch
from rllm.engine.rollout.scoring import score_episode
from rllm.sdk import evaluator
from rllm.sdk.evaluator import as_evaluator
from rllm.types import Episode, EvalOutput, Step, Task, Trajectory

TASK = Task(id="t", instruction="say: apple")


@pytest.fixture(autouse=True)
def wide_margins(monkeypatch: pytest.MonkeyPatch) -> None:
    """Thresholds far above a trivial call's time, so a loaded CI host cannot tip a cheap call
    over (the 'slow' calls below sleep past them)."""
    monkeypatch.setattr(eval_dispatch, "CHEAP_S", 0.05)
    monkeypatch.setattr(eval_dispatch, "SLOW_INLINE_S", 0.1)


def episode() -> Episode:
    return Episode(task_id="t", trajectories=[Trajectory(role="default", steps=[Step()])])


class Recorder:
    """A sync evaluator that records the thread of each call and can be told to be slow or fail."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []
        self.busy_s = 0.0
        self.fail = False

    def evaluate(self, task: Task, ep: Episode) -> EvalOutput:
        self.threads.append(threading.current_thread())
        if self.busy_s:
            time.sleep(self.busy_s)  # the evaluator's own (blocking) work, not a synchronisation
        if self.fail:
            raise ZeroDivisionError("grader bug")
        return EvalOutput(reward=1.0, is_correct=True)


async def score_n(rec: Recorder, dispatch: EvalDispatch, n: int) -> list[Episode]:
    fn = as_evaluator(rec)
    out = []
    for _ in range(n):
        ep = episode()
        await score_episode(TASK, ep, fn, 5.0, dispatch)
        out.append(ep)
    return out


async def test_a_cheap_sync_evaluator_moves_inline_after_its_probation() -> None:
    rec = Recorder()
    dispatch = EvalDispatch(as_evaluator(rec))
    episodes = await score_n(rec, dispatch, PROBATION_CALLS + 5)
    main = threading.current_thread()
    assert all(t is not main for t in rec.threads[:PROBATION_CALLS])  # the pool while on probation
    assert all(t is main for t in rec.threads[PROBATION_CALLS:])  # then on the loop's own thread
    assert (dispatch.pool_calls, dispatch.inline_calls) == (PROBATION_CALLS, 5)
    # The verdict is written the same way on both paths.
    assert {(ep.is_correct, ep.trajectories[0].reward) for ep in episodes} == {(True, 1.0)}


async def test_an_evaluator_that_is_never_cheap_stays_in_the_pool() -> None:
    rec = Recorder()
    rec.busy_s = eval_dispatch.CHEAP_S * 1.5
    dispatch = EvalDispatch(as_evaluator(rec))
    await score_n(rec, dispatch, PROBATION_CALLS + 2)
    assert dispatch.inline_calls == 0
    assert threading.current_thread() not in rec.threads


async def test_one_slow_call_restarts_the_probation() -> None:
    rec = Recorder()
    dispatch = EvalDispatch(as_evaluator(rec))
    await score_n(rec, dispatch, PROBATION_CALLS - 1)
    rec.busy_s = eval_dispatch.CHEAP_S * 1.5
    await score_n(rec, dispatch, 1)
    rec.busy_s = 0.0
    await score_n(rec, dispatch, PROBATION_CALLS - 1)
    assert dispatch.inline_calls == 0 and not dispatch.inline


async def test_an_inline_call_that_blocks_the_loop_sends_it_back_to_the_pool_for_good(caplog) -> None:
    rec = Recorder()
    dispatch = EvalDispatch(as_evaluator(rec))
    await score_n(rec, dispatch, PROBATION_CALLS)
    assert dispatch.inline
    rec.busy_s = eval_dispatch.SLOW_INLINE_S * 1.5
    with caplog.at_level("INFO", logger="rllm.engine.rollout.eval_dispatch"):
        await score_n(rec, dispatch, 1)  # ran inline, was slow
    assert "runs in a thread pool from now on" in caplog.text
    rec.busy_s = 0.0
    before = len(rec.threads)
    await score_n(rec, dispatch, PROBATION_CALLS + 3)  # cheap again: still never inline
    main = threading.current_thread()
    assert all(t is not main for t in rec.threads[before:])
    assert dispatch.banned and not dispatch.inline


async def test_an_evaluator_may_opt_out_of_running_inline() -> None:
    rec = Recorder()
    rec.inline_ok = False  # type: ignore[attr-defined]
    dispatch = EvalDispatch(as_evaluator(rec))
    await score_n(rec, dispatch, PROBATION_CALLS + 2)
    assert dispatch.inline_calls == 0

    @evaluator
    def judged(task: Task, ep: Episode) -> float:
        return 1.0

    judged.inline_ok = False  # on the @evaluator wrapper
    assert not EvalDispatch(judged).allowed


async def test_an_inline_evaluator_error_is_recorded_like_a_pool_one() -> None:
    rec = Recorder()
    dispatch = EvalDispatch(as_evaluator(rec))
    await score_n(rec, dispatch, PROBATION_CALLS)
    rec.fail = True
    [ep] = await score_n(rec, dispatch, 1)
    assert rec.threads[-1] is threading.current_thread()  # it ran inline
    assert ep.metadata["eval_error"]["type"] == "ZeroDivisionError"
    assert (ep.is_correct, ep.trajectories[0].reward) == (False, 0.0)


async def test_the_deadline_still_holds_in_the_pool() -> None:
    started = threading.Event()
    release = threading.Event()

    @evaluator
    def hangs(task: Task, ep: Episode) -> float:
        started.set()
        release.wait(10)
        return 1.0

    ep = episode()
    try:
        await score_episode(TASK, ep, hangs, 0.2, EvalDispatch(hangs))
    finally:
        release.set()
    assert started.is_set()
    assert ep.metadata["eval_error"]["type"] == "DeadlineExceeded"


@pytest.mark.parametrize("n", [PROBATION_CALLS + 3])
async def test_async_evaluators_do_not_use_the_dispatch(n: int) -> None:
    calls: list[bool] = []

    @evaluator
    async def graded(task: Task, ep: Episode) -> float:
        calls.append(True)
        await asyncio.sleep(0)
        return 0.5

    dispatch = EvalDispatch(graded)
    for _ in range(n):
        ep = episode()
        await score_episode(TASK, ep, graded, 5.0, dispatch)
        assert ep.trajectories[0].reward == 0.5
    assert len(calls) == n and dispatch.pool_calls == dispatch.inline_calls == 0
