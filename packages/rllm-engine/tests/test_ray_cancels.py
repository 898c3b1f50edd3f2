"""A Ray flow worker's cancel bookkeeping (``rllm.engine.rollout.ray_cancels``), under every order in
which Ray may deliver the driver's submit and cancel calls: a cancel that overtook its job stops
it, and nothing is kept once every call has arrived (the worker's ``_cancelled`` set used to keep
each cancel that came after its job ended, growing over a long run without bound)."""

from __future__ import annotations

from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from rllm.engine.rollout.ray_cancels import EarlyCancels


@st.composite
def _driver_calls(draw: st.DrawFn) -> tuple[list[tuple[str, int, list[int]]], set[int]]:
    """The driver's calls in the order it sends them: ``("submit", batch, job ids)`` and
    ``("cancel", sent_through, job ids)`` (only of jobs sent already), and the quick jobs (those
    that end as soon as they start)."""
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=8))
    calls: list[tuple[str, int, list[int]]] = []
    sent: list[int] = []
    cancelled: set[int] = set()
    next_id = 1
    for batch, size in enumerate(sizes, start=1):
        ids = list(range(next_id, next_id + size))
        next_id += size
        calls.append(("submit", batch, ids))
        sent += ids
        open_ids = [j for j in sent if j not in cancelled]  # the driver cancels a job once
        cancels = draw(st.lists(st.sampled_from(open_ids), unique=True, max_size=3)) if open_ids else []
        if cancels:
            cancelled.update(cancels)
            calls.append(("cancel", batch, cancels))
    quick = set(draw(st.lists(st.sampled_from(range(1, next_id)), unique=True)))
    return calls, quick


@settings(max_examples=300, deadline=timedelta(seconds=5))
@given(data=st.data(), drawn=_driver_calls())
def test_a_cancel_stops_its_job_in_any_delivery_order_and_nothing_is_kept_after(
    data: st.DataObject, drawn: tuple[list[tuple[str, int, list[int]]], set[int]]
) -> None:
    calls, quick = drawn
    delivered = data.draw(st.permutations(calls))  # Ray does not order an async actor's calls
    bookkeeping = EarlyCancels()
    running: set[int] = set()
    cancel_came: set[int] = set()  # jobs whose cancel was delivered, by then
    for kind, number, ids in delivered:
        if kind == "submit":
            skipped = bookkeeping.batch_arrived(number, ids)
            assert skipped == set(ids) & cancel_came  # exactly those whose cancel came first
            for job_id in ids:
                if job_id not in skipped and job_id not in quick:
                    running.add(job_id)  # a quick one has ended already
        else:
            for job_id in ids:
                cancel_came.add(job_id)
                if job_id in running:
                    running.discard(job_id)  # FlowWorker.cancel cancels its task
                else:
                    bookkeeping.cancel_not_running(job_id, number)
    assert len(bookkeeping) == 0  # every call arrived: nothing left to wait for
    assert bookkeeping.arrived_through == sum(1 for kind, *_ in calls if kind == "submit")


def test_many_cancels_of_ended_jobs_leave_nothing_behind() -> None:
    """A long run's worth of cancels that each came after its job ended (the common case for a
    dropped group whose results were already on their way): none is kept."""
    bookkeeping = EarlyCancels()
    for batch in range(1, 10_001):
        assert bookkeeping.batch_arrived(batch, [batch]) == set()
        bookkeeping.cancel_not_running(batch, batch)  # the job ended before its cancel came
    assert len(bookkeeping) == 0
