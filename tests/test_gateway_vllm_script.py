"""scripts/gateway_vllm.sh (nox -s gateway-vllm) stops, non-zero and saying why, when vLLM does not
come up — before, it ran the tests against nothing once its wait ran out — and leaves no server
behind. A stand-in "vLLM" that never serves, and a 3 s start limit, make the case quick."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_vllm_that_never_serves_stops_the_script_and_is_killed(tmp_path: Path) -> None:
    pid_file = tmp_path / "server.pid"
    fake = tmp_path / "python"
    fake.write_text(f"#!/usr/bin/env bash\necho $$ > {pid_file}\nexec sleep 600\n")
    fake.chmod(0o755)
    env = {**os.environ, "RLLM_VLLM_PYTHON": str(fake), "RLLM_VLLM_START_S": "3", "RLLM_VLLM_PORT": "1"}
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gateway_vllm.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert "vLLM not serving after 3 s" in done.stderr
    assert "passed" not in done.stdout  # no test ran
    pid = int(pid_file.read_text())
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
