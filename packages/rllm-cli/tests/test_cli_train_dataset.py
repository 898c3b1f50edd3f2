"""`rllm train NAME --agent COOKBOOK`: a registered dataset trains with a cookbook's agent, as
`rllm eval` evaluates it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rllm.cli.eval_cmd import train_cookbook
from rllm.cli.main import main
from rllm.engine.training.launch import build_trainer

WORDS = ["apple", "river", "lemon", "stone"]


@pytest.fixture
def words(rllm_home: Path, tmp_path: Path) -> str:
    for split, chosen in (("train", WORDS), ("test", WORDS[:2])):
        path = tmp_path / f"{split}.jsonl"
        path.write_text("".join(json.dumps({"question": f"say: {w}", "answer": [w]}) + "\n" for w in chosen))
        assert main(["dataset", "register", "words", str(path), "--split", split]) == 0
    return "words"


def test_a_registered_dataset_trains_with_a_cookbooks_agent(words: str, tmp_path: Path) -> None:
    cookbook = train_cookbook(words, "say-single", None)
    trainer = build_trainer(
        words, cookbook=cookbook, out_dir=str(tmp_path / "run"), overrides=["total_steps=1"]
    )
    assert [t.instruction for t in trainer.train_tasks] == [f"say: {w}" for w in WORDS]
    assert [t.instruction for t in trainer.val_tasks] == ["say: apple", "say: river"]
    assert trainer.config.cookbook == words
    # The agent cookbook's training defaults come along (say-single's group size, not the default 8).
    from rllm.engine.plugins import load_cookbook

    assert trainer.config.group_size == load_cookbook("say-single").train_defaults.get("group_size", 8)


def test_a_dataset_without_an_agent_says_what_to_pass(
    words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", words, "--out", str(tmp_path / "run")]) == 2
    assert "needs --agent" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_a_split_the_dataset_lacks_is_refused_before_building(
    words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    assert main(["train", words, "--agent", "say-single", "--out", str(out), "train_split=dev"]) == 2
    assert "no split 'dev'" in capsys.readouterr().err
    assert not out.exists()
