"""What `rllm` loads before it knows the command: every command (and every test that runs the CLI
as a process, and each rollout worker, which re-imports it) pays for it at start-up. The heavy
parts (the Trainer, the gateway, numpy, aiohttp, torch) load with the command that uses them."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ["aiohttp", "numpy", "rllm.engine.training.trainer", "rllm.gateway", "torch", "transformers"]


def test_importing_the_command_loads_no_heavy_module() -> None:
    probe = f"import sys, rllm.cli.main; print(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert loaded.stdout.split() == []


def test_the_engine_package_still_exports_its_names_on_use() -> None:
    import rllm.engine
    from rllm.engine.training.trainer import Trainer

    assert rllm.engine.Trainer is Trainer
    assert "build_trainer" in dir(rllm.engine)
