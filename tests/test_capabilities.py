"""The capability matrix in docs/ is the one the code gives, and it follows the backends' checks."""

from __future__ import annotations

from array import array
from pathlib import Path

import pytest

from rllm.algos.config import AlgorithmConfig
from rllm.backends.fireworks.backend import FireworksBackend
from rllm.backends.tinker.backend import TinkerBackend
from rllm.cli.capabilities_cmd import full_markdown
from rllm.cli.main import main
from rllm.engine.capabilities import capability_matrix
from rllm.engine.modality import refuse_images
from rllm.types import ConfigError, TrainSequence
from rllm.types.errors import StateError

DOC = Path(__file__).parents[1] / "docs" / "capabilities.md"


def test_docs_hold_the_generated_matrix() -> None:
    assert DOC.read_text(encoding="utf-8") == full_markdown(), (
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
    # Only the local sampler aborts a call in flight and continues it token for token (#30).
    partial = marks["RL, asynchronous, partial rollouts (rollout.partial)"]
    assert [c for c, ok in partial.items() if ok] == ["tinker local"]
    assert all(marks["command"].values()) and all(marks["remote"].values())


def test_a_changed_validation_makes_the_doc_stale(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    def refuse_gspo(self, algo) -> None:
        if algo.loss == "gspo":
            raise ValueError("no gspo")

    monkeypatch.setattr(FireworksBackend, "validate", refuse_gspo)
    assert DOC.read_text(encoding="utf-8") != full_markdown()
    assert main(["capabilities", "--check", str(DOC)]) == 1
    assert "not the current capability matrix" in capsys.readouterr().err


def test_the_modality_rows_are_the_backends_image_checks() -> None:
    columns, rows = capability_matrix()
    marks = {row: dict(zip(columns, m, strict=True)) for _, row, m in rows}
    assert all(marks["text"].values())
    # Images: the local Tinker service and verl put the pixels beside the placeholder tokens; the
    # remote Tinker service and Fireworks send token ids only.
    assert marks["images"] == {"fireworks": False, "tinker local": True, "tinker remote": False, "verl": True}


def _sequence(images: list[str]) -> TrainSequence:
    return TrainSequence(
        input_ids=array("i", [1, 2, 3]),
        loss_mask=array("f", [0, 1, 1]),
        advantages=array("f", [0, 1, 1]),
        sampler_logprobs=array("f", [0, -1, -1]),
        images=images,
    )


async def test_a_batch_with_images_is_refused_before_a_text_only_backend_trains_on_it() -> None:
    remote = TinkerBackend({"service": "remote", "model": "probe", "lora": {"rank": 8}})
    algo = AlgorithmConfig()
    with pytest.raises(ConfigError, match="does not train on images here: the remote Tinker service"):
        await remote.train_step([_sequence([]), _sequence(["data:image/png;base64,AAAA"])], algo)
    # Control: a text batch passes the check and gets as far as the unstarted service.
    with pytest.raises(StateError, match="not started"):
        await remote.train_step([_sequence([])], algo)
    with pytest.raises(ConfigError, match="backend 'fireworks' does not train on images"):
        refuse_images(FireworksBackend({"model": "probe"}), [_sequence(["data:image/png;base64,AAAA"])])
    refuse_images(FireworksBackend({"model": "probe"}), [_sequence([])])  # text: nothing to refuse


def test_the_adapters_table_is_what_each_adapter_declares() -> None:
    text = full_markdown().split("## Environment adapters", 1)[1]
    rows = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[4:-1]]
        for line in text.splitlines()
        if line.startswith("| `")
    }
    # columns: single-turn, multi-turn, tools, train, eval
    assert rows["`verifiers:`"] == ["yes", "yes", "yes", "yes", "yes"]
    assert rows["`reasoning-gym:`"] == ["yes", "no", "no", "yes", "yes"]
    assert rows["`mcp:`"] == ["no", "yes", "yes", "yes", "yes"]
    assert rows["`openenv:`"] == ["no", "yes", "yes", "yes", "yes"]
