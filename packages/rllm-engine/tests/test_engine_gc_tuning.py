"""GC threshold while an engine runs: raised on start, restored on close (the helpers' own rules
are tested with the gateway, which owns them)."""

from __future__ import annotations

import gc

import pytest

from rllm.engine.rollout.rollout_config import RolloutConfig
from rllm.engine.rollout.rollout_engine import RolloutEngine
from rllm.sdk import rollout
from rllm.types import InvariantError


def test_config_refuses_a_bad_threshold():
    with pytest.raises(InvariantError, match="gc_gen0_threshold"):
        RolloutConfig(gc_gen0_threshold=0)


@rollout
async def _noop(task, config):
    return {"gc_gen0": gc.get_threshold()[0]}


async def test_engine_raises_while_running_and_restores_on_close(upstream):
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    try:
        config = RolloutConfig(progress=False, gc_gen0_threshold=12_345)
        async with RolloutEngine(_noop, None, config, upstreams=[upstream.url]) as engine:
            (episode,) = await engine.run([{"id": "t", "instruction": "x"}])
            assert episode.artifacts["gc_gen0"] == 12_345
        assert gc.get_threshold() == (700, 10, 10)
    finally:
        gc.set_threshold(*before)
