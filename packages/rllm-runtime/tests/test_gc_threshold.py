"""GC threshold helpers: raised, never lowered, restored."""

from __future__ import annotations

import gc

import pytest

from rllm.runtime.gc_threshold import raise_gc_threshold, restore_gc_threshold


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
