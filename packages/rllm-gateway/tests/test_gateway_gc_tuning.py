"""GC threshold helpers (raised, never lowered, restored) and ``rllm-gateway serve``'s use of them."""

from __future__ import annotations

import gc

import pytest

from rllm.gateway.cli import prepare_process
from rllm.gateway.config import GatewayConfig
from rllm.gateway.gc_tuning import raise_gc_threshold, restore_gc_threshold
from rllm.types import InvariantError


@pytest.fixture(autouse=True)
def _keep_gc_settings():
    before, enabled = gc.get_threshold(), gc.isenabled()
    yield
    gc.set_threshold(*before)
    (gc.enable if enabled else gc.disable)()


def test_raise_and_restore():
    gc.set_threshold(700, 10, 10)
    previous = raise_gc_threshold(5000)
    assert previous == (700, 10, 10) and gc.get_threshold() == (5000, 10, 10)
    assert raise_gc_threshold(3000) is None and gc.get_threshold() == (5000, 10, 10)  # never lowered
    restore_gc_threshold(previous)
    assert gc.get_threshold() == (700, 10, 10)


def test_disabled_collector_and_none_are_left_alone():
    gc.set_threshold(700, 10, 10)
    assert raise_gc_threshold(None) is None
    gc.disable()
    assert raise_gc_threshold(5000) is None and gc.get_threshold() == (700, 10, 10)
    gc.enable()
    gc.set_threshold(0)  # threshold 0 also means "no automatic collection"
    assert raise_gc_threshold(5000) is None


def test_gateway_config_refuses_a_bad_threshold():
    with pytest.raises(InvariantError, match="gc_gen0_threshold"):
        GatewayConfig(gc_gen0_threshold=0)


def test_serve_raises_the_threshold_for_its_process_unless_told_not_to():
    import asyncio

    policy = asyncio.get_event_loop_policy()
    try:
        gc.set_threshold(700, 10, 10)
        prepare_process(GatewayConfig(gc_gen0_threshold=None))
        assert gc.get_threshold() == (700, 10, 10)
        prepare_process(GatewayConfig())
        assert gc.get_threshold() == (50_000, 10, 10)
    finally:
        asyncio.set_event_loop_policy(policy)  # prepare_process installed uvloop's
