"""`rllm eval` end to end: the say cookbook's agent in worker processes against a loopback server.

The command runs as a user runs it (a subprocess), with two flow processes; the upstream is a real
OpenAI-compatible HTTP server (MockUpstream) that answers each turn with the asked-for word,
except one turn of one task, so exactly that task fails.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from rllm.testing import MockUpstream, say_back


def _tiger_lemon(messages: list[dict[str, Any]], word: str) -> bool:
    # Test task "tiger-lemon" (first turn "say: tiger"): answer its second turn wrong.
    return messages[0]["content"] == "say: tiger" and word == "lemon"


async def _eval(out: Path, url: str, *extra: str) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "rllm.cli.main", "eval", "say", "--base-url", url, "--out", str(out)),
        *extra,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await asyncio.wait_for(proc.communicate(), 180)
    assert proc.returncode == 0, stderr.decode()[-3000:]
    return json.loads((out / "summary.json").read_text())


async def test_eval_command_in_worker_processes_writes_results_and_resumes(tmp_path: Path) -> None:
    upstream = MockUpstream(responder=say_back(wrong_when=_tiger_lemon))
    await upstream.start()
    try:
        out = tmp_path / "eval"
        # --max-tokens 16: the mock's tokens are bytes; the cookbook's own limit (4) fits its
        # tiny model, whose words are single tokens.
        summary = await _eval(out, upstream.url, "--workers", "2", "--concurrency", "4", "--max-tokens", "16")
        rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
        assert summary["num_tasks"] == len(rows) == 16 and summary["resumed_tasks"] == 0
        failed = [r["task_id"] for r in rows if not r["attempts"][0]["is_correct"]]
        assert failed == ["tiger-lemon"]
        assert summary["accuracy"] == 15 / 16 and summary["termination"] == {"done": 16}
        chats = upstream.stats.by_path
        assert chats["/v1/chat/completions"] == 16 * 2  # two turns per task, each answered once

        # The same command with --resume: nothing left to run.
        again = await _eval(
            out, upstream.url, "--workers", "2", "--concurrency", "4", "--max-tokens", "16", "--resume"
        )
        assert again["resumed_tasks"] == 16 and again["accuracy"] == summary["accuracy"]
        assert chats["/v1/chat/completions"] == 16 * 2
    finally:
        await upstream.stop()
