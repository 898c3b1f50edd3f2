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


def test_cookbook_options_set_up_the_agent_s_cookbook(words: str, tmp_path: Path) -> None:
    """cookbook_options reach --agent's cookbook (its evaluator here), not dropped and not refused
    because the dataset itself takes none."""
    cookbook = train_cookbook(words, "math", None)
    trainer = build_trainer(
        words,
        cookbook=cookbook,
        out_dir=str(tmp_path / "run"),
        overrides=["total_steps=1", "cookbook_options.format_coef=0.1"],
    )
    assert trainer.cookbook.evaluator.format_coef == 0.1


@pytest.mark.parametrize(
    ("agent", "option", "message"),
    [
        ("math", "cookbook_options.format_coeff=0.1", "unknown math option"),
        ("rllm_cookbook_math:math_flow", "cookbook_options.format_coef=0.1", "a flow, which takes none"),
    ],
)
def test_an_option_the_agent_does_not_take_is_refused_before_the_run_folder(
    words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], agent: str, option: str, message: str
) -> None:
    out = tmp_path / "run"
    assert main(["train", words, "--agent", agent, "--out", str(out), option]) == 2
    err = capsys.readouterr().err
    assert "cookbook_options" in err and message in err, err
    assert not out.exists()


def test_eval_options_reach_the_agent_s_cookbook_and_a_flow_agent_refuses_them(words: str) -> None:
    from rllm.cli.errors import CliError
    from rllm.cli.eval_cmd import resolve_eval_target

    tasks, _, grader = resolve_eval_target(words, "test", "math", None, {"format_coef": 0.25})
    assert len(tasks) == 2 and grader.format_coef == 0.25
    with pytest.raises(CliError, match=r"--option: .*a flow, which takes none"):
        resolve_eval_target(words, "test", "rllm_cookbook_math:math_flow", None, {"format_coef": 0.25})
