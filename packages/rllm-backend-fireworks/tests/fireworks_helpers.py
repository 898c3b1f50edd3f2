"""What the fireworks tests share besides fixtures (a uniquely named module: test files of other
packages have their own conftest, so ``from conftest import`` would find the wrong one)."""

from __future__ import annotations

from typing import Any

from rllm.testing.fireworks import FakeFireworksServer

MODEL = "accounts/fireworks/models/qwen3-0p6b"


def options(server: FakeFireworksServer, **overrides: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "base_url": server.url,
        "lora_rank": 8,
        "learning_rate": 1e-2,
        "grad_clip": 0.0,
        "poll_interval_s": 0.01,
        "request_timeout_s": 60.0,
        "hot_load_timeout_s": 60,
        **overrides,
    }
