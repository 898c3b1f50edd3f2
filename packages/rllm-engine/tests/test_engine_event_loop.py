"""rllm.engine.event_loop.run: uvloop when installed, the standard loop when switched off."""

from __future__ import annotations

import asyncio

import pytest

from rllm.engine.event_loop import run, use_uvloop

uvloop = pytest.importorskip("uvloop")


async def _loop_type() -> str:
    await asyncio.sleep(0)
    return type(asyncio.get_running_loop()).__module__


def test_run_uses_uvloop_by_default(monkeypatch):
    monkeypatch.delenv("RLLM_UVLOOP", raising=False)
    assert use_uvloop()
    assert run(_loop_type()).startswith("uvloop")


@pytest.mark.parametrize("value", ["0", "false", "OFF"])
def test_rllm_uvloop_0_keeps_the_standard_loop(monkeypatch, value):
    monkeypatch.setenv("RLLM_UVLOOP", value)
    assert not use_uvloop()
    assert run(_loop_type()).startswith("asyncio")
