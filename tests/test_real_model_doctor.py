"""`rllm doctor tokens` on a real model's tokenizer and chat template: SmolLM2-135M-Instruct
(ChatML, a system prompt the template adds when the chat has none, byte-level BPE), as
`rllm model import` wrote it from its GGUF."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rllm.cli.main import main

pytestmark = pytest.mark.real_model


def test_doctor_passes_on_smollm2s_template(smollm2: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["doctor", "tokens", str(smollm2), "--json"])
    report = json.loads(capsys.readouterr().out)
    statuses = {check["name"]: check["status"] for check in report["checks"]}
    assert code == 0 and report["ok"], report
    # Multi-turn extension (one segment over 3 turns) and streaming ids are exact on this template.
    assert statuses["multi-turn text"] == "pass" and statuses["streaming = non-streaming"] == "pass", statuses
