"""Event-loop lag: measured on a real loop, stamped on each Episode, warned about once."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from rllm.engine.rollout.loop_lag import LoopLagMonitor
from rllm.engine.rollout.rollout_config import RolloutConfig
from rllm.engine.rollout.rollout_engine import RolloutEngine
from rllm.sdk import rollout
from rllm.sdk.clients import async_openai
from rllm.types import AgentConfig


async def test_a_blocked_loop_shows_the_block():
    # Only lower bounds are asserted: how little an idle loop lags is the machine's to decide
    # (a loaded CI runner delays any timer), how much a block adds is not.
    monitor = LoopLagMonitor(interval_s=0.02, window=50)
    monitor.start()
    try:
        await asyncio.sleep(0.2)
        time.sleep(0.25)  # holds the loop: the tick due within 20 ms cannot run
        assert monitor.lag_s >= 0.22  # counted while still overdue
        await asyncio.sleep(0.05)
        assert monitor.lag_s >= 0.22  # and remembered once the late tick ran
    finally:
        monitor.stop()


async def test_only_ticks_while_busy_count():
    busy = False
    monitor = LoopLagMonitor(interval_s=0.02, busy=lambda: busy)
    monitor.start()
    try:
        time.sleep(0.15)  # e.g. a trainer's update between rollout batches
        await asyncio.sleep(0.05)
        assert monitor.lag_s == 0.0 and monitor.late_ticks == 0
        busy = True
        time.sleep(0.15)
        await asyncio.sleep(0.05)
        assert monitor.lag_s >= 0.12 and monitor.late_ticks == 1
        assert monitor.check() >= 0.12  # one late tick: no warning (see the engine test)
    finally:
        monitor.stop()


@rollout
async def answer_then_block(task, config):
    async with async_openai(config) as client:
        reply = await client.chat.completions.create(
            model=config.model, messages=[{"role": "user", "content": task.instruction}]
        )
    if "block" in task.instruction:
        time.sleep(0.3)  # synchronous work inside an async flow: the whole loop waits
    return reply.choices[0].message.content


async def test_episodes_carry_the_lag_and_a_blocking_flow_gets_one_warning(gateway, caplog):
    config = RolloutConfig(concurrency=2, progress=False)
    caplog.set_level(logging.WARNING, logger="rllm.engine")
    # `rllm` commands run in this process by earlier tests quiet this logger (rllm.cli.quiet): hear it.
    caplog.set_level(logging.WARNING, logger="rllm.engine.rollout.loop_lag")
    async with async_openai(AgentConfig(base_url=gateway.url)):
        pass  # the clients' shared SSL context is built once (it blocks the loop), before timing
    async with RolloutEngine(answer_then_block, None, config, gateway_url=gateway.url) as engine:
        (calm,) = await engine.run([{"id": "calm", "instruction": "What is 2+2?"}])
        assert "loop_lag_s" in calm.metrics  # its size is the machine's load (no bound asserted)
        assert not [r for r in caplog.records if "event loop" in r.getMessage()]

        one = await engine.run([{"id": "b0", "instruction": "block: 2+2?"}])
        assert one[0].metrics["loop_lag_s"] >= 0.19  # on the Episode, but one block is no warning
        assert not [r for r in caplog.records if "event loop" in r.getMessage()]

        blocked = await engine.run([{"id": f"b{i}", "instruction": "block: 2+2?"} for i in range(1, 6)])
        # A 0.3 s block makes the tick that fell due during it late by 0.3 s minus up to one
        # 0.1 s interval.
        assert all(ep.metrics["loop_lag_s"] >= 0.19 for ep in blocked)
        assert engine.last_stats["loop_lag_max_s"] >= 0.19
    warnings = [r.getMessage() for r in caplog.records if "event loop" in r.getMessage()]
    assert len(warnings) == 1  # once most recent ticks were late; once per engine
    assert "rollout.workers" in warnings[0] and "blocks the loop" in warnings[0]


def test_a_rollout_worker_quiets_the_loggers_its_command_quieted(monkeypatch: pytest.MonkeyPatch) -> None:
    """`rllm` quiets the lag paragraph at the terminal; the workers, which print it, must too."""
    import logging

    from rllm.engine.rollout.worker_pool import QUIET_LOGGERS_ENV, quiet_loggers_from_env

    lag, other = (
        logging.getLogger("rllm.engine.rollout.loop_lag"),
        logging.getLogger("rllm.engine.test_other"),
    )
    quieted = logging.getLogger("rllm.engine.test_quieted")
    before = lag.level, other.level, quieted.level
    try:
        lag.setLevel(logging.NOTSET)
        monkeypatch.setenv(QUIET_LOGGERS_ENV, "rllm.engine.rollout.loop_lag, rllm.engine.test_quieted")
        quiet_loggers_from_env()
        assert lag.getEffectiveLevel() == logging.ERROR
        assert quieted.level == logging.ERROR
        assert other.level == logging.NOTSET  # only the named ones
    finally:
        lag.setLevel(before[0])
        other.setLevel(before[1])
        quieted.setLevel(before[2])
