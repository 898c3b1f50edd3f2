"""The capability matrix in docs/ is the one the code gives, and it follows the backends' checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from rllm.backends.fireworks.backend import FireworksBackend
from rllm.cli.main import main
from rllm.engine.capabilities import capability_matrix, render_markdown

DOC = Path(__file__).parents[1] / "docs" / "capabilities.md"


def test_docs_hold_the_generated_matrix() -> None:
    assert DOC.read_text(encoding="utf-8") == render_markdown(), (
        "docs/capabilities.md is stale: run `uv run rllm capabilities --write docs/capabilities.md`"
    )


def test_the_matrix_is_what_the_backends_validate() -> None:
    columns, rows = capability_matrix()
    marks = {row: dict(zip(columns, m, strict=True)) for _, row, m in rows}
    # Spot checks against the refusals the backends state (tinker remote / fireworks: no KL, no
    # TIS; verl measures the mismatch as the local service does; async training only on the local
    # service).
    assert marks["kl_coef > 0"] == {
        "fireworks": False,
        "tinker local": True,
        "tinker remote": False,
        "verl": True,
    }
    assert marks["max_mismatch"]["verl"] is True
    assert [c for c, ok in marks["RL, asynchronous (max_staleness > 0)"].items() if ok] == ["tinker local"]
    # No backend can abort a call in flight and continue it token for token yet (issue #30).
    assert not any(marks["RL, asynchronous, partial rollouts (rollout.partial)"].values())
    assert all(marks["command"].values()) and all(marks["remote"].values())


def test_a_changed_validation_makes_the_doc_stale(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    def refuse_gspo(self, algo) -> None:
        if algo.loss == "gspo":
            raise ValueError("no gspo")

    monkeypatch.setattr(FireworksBackend, "validate", refuse_gspo)
    assert DOC.read_text(encoding="utf-8") != render_markdown()
    assert main(["capabilities", "--check", str(DOC)]) == 1
    assert "not the current capability matrix" in capsys.readouterr().err
