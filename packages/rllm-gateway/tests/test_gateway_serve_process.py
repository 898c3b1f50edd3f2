"""``rllm-gateway serve`` raises its process's GC threshold (rllm.runtime.gc_threshold) unless told not to."""

from __future__ import annotations

import gc

import pytest

from rllm.gateway.command import prepare_process
from rllm.gateway.config import GatewayConfig
from rllm.types import InvariantError


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
