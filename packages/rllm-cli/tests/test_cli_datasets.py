"""The dataset registry as a new user meets it: no silent replacement, each split's own source
and columns, and a plain sentence for every bad file (never a library's exception text)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from rllm.cli.main import cli


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_registering_an_existing_split_needs_force(rllm_home: Path, tmp_path: Path) -> None:
    first = _jsonl(tmp_path / "a.jsonl", [{"question": "q1", "answer": "1"}])
    second = _jsonl(
        tmp_path / "b.jsonl", [{"question": "q2", "answer": "2"}, {"question": "q3", "answer": "3"}]
    )
    assert invoke("dataset", "register", "d", str(first))[0] == 0
    code, _, err = invoke("dataset", "register", "d", str(second))
    assert code == 2 and "already has split 'train'" in err and "--force" in err
    code, out, _ = invoke("dataset", "list")
    assert "train (1)" in out  # untouched
    assert invoke("dataset", "register", "d", str(second), "--force")[0] == 0
    code, out, _ = invoke("dataset", "list")
    assert "train (2)" in out


def test_each_split_keeps_its_own_source_and_columns(rllm_home: Path, tmp_path: Path) -> None:
    train = _jsonl(tmp_path / "train.jsonl", [{"question": "q", "answer": "a"}])
    test = _jsonl(tmp_path / "test.jsonl", [{"problem": "p", "solution": "s"}])
    assert invoke("dataset", "register", "d", str(train))[0] == 0
    args = ["--split", "test", "--instruction-column", "problem", "--answer-column", "solution"]
    assert invoke("dataset", "register", "d", str(test), *args)[0] == 0
    code, out, _ = invoke("dataset", "inspect", "d")
    assert code == 0
    lines = {line.split(":")[0]: line for line in out.splitlines() if line.startswith("split ")}
    assert str(train) in lines["split train"] and "instruction <- question" in lines["split train"]
    assert str(test) in lines["split test"] and "instruction <- problem" in lines["split test"]


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("empty.csv", b"", "is empty"),
        ("blank.jsonl", b"\n\n", "is empty"),
        ("header.csv", b"question,answer\n", "has a header but no rows"),
        ("binary.csv", bytes(range(256)) * 4, "is not text"),
        ("bad.jsonl", b'{"question": "a"}\n' * 6 + b"{oops\n", "line 7 of"),
        ("list.jsonl", b'["question"]\n', "line 1 of"),
        ("bad.json", b'{"question": ', "is not JSON"),
    ],
)
def test_bad_files_get_a_plain_sentence(
    rllm_home: Path, tmp_path: Path, name: str, content: bytes, message: str
) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    code, _, err = invoke("dataset", "register", "d", str(path))
    assert code == 2 and message in err and str(path) in err, err
    for library_text in ("DatasetGenerationError", "StopIteration", "pyarrow", "Traceback"):
        assert library_text not in err
    assert len([line for line in err.splitlines() if line.startswith("error:")]) == 1


def test_a_directory_is_named_as_one(rllm_home: Path, tmp_path: Path) -> None:
    code, _, err = invoke("dataset", "register", "d", str(tmp_path))
    assert code == 2 and "is a directory" in err


def test_register_and_inspect_print_no_progress_bars(
    rllm_home: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from rllm.cli.main import main

    source = _jsonl(tmp_path / "w.jsonl", [{"question": f"q{i}", "answer": str(i)} for i in range(3)])
    assert main(["dataset", "register", "w", str(source)]) == 0
    assert main(["dataset", "inspect", "w"]) == 0
    captured = capfd.readouterr()
    assert "registered w/train: 3 tasks" in captured.err
    for bar in ("Generating", "Creating parquet", "it/s", "%|"):
        assert bar not in captured.err + captured.out
