"""rllm.runtime.event_loop.run: uvloop by default for worker processes, per-caller default,
RLLM_UVLOOP overriding both ways."""

from __future__ import annotations

import asyncio

import pytest

from rllm.runtime.event_loop import run, use_uvloop

uvloop = pytest.importorskip("uvloop")


async def _loop_type() -> str:
    await asyncio.sleep(0)
    return type(asyncio.get_running_loop()).__module__


def test_the_callers_default_decides_without_the_variable(monkeypatch):
    monkeypatch.delenv("RLLM_UVLOOP", raising=False)
    assert use_uvloop() and not use_uvloop(default=False)
    assert run(_loop_type()).startswith("uvloop")
    assert run(_loop_type(), uvloop_default=False).startswith("asyncio")


@pytest.mark.parametrize("value", ["0", "false", "OFF"])
def test_rllm_uvloop_0_keeps_the_standard_loop(monkeypatch, value):
    monkeypatch.setenv("RLLM_UVLOOP", value)
    assert not use_uvloop()
    assert run(_loop_type()).startswith("asyncio")


def test_rllm_uvloop_1_turns_it_on_where_the_default_is_off(monkeypatch):
    monkeypatch.setenv("RLLM_UVLOOP", "1")
    assert run(_loop_type(), uvloop_default=False).startswith("uvloop")
