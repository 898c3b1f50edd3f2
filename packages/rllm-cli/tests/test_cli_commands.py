"""The click commands through click's runner: datasets, cookbooks, eval, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from rllm.cli.main import cli
from rllm.testing import MockUpstream


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# The loopback server's tokens are bytes: a word needs more than the say flow's 4 tokens.
BYTES = ["--max-tokens", "16"]

WORD_ROWS = [
    {"key": f"t{i}", "question": f"say: {w}", "answer": [w], "words": [w]}
    for i, w in enumerate(["apple", "river", "lemon"])
]


def test_every_command_has_help_with_an_example() -> None:
    for args in (
        [],
        ["train"],
        ["eval"],
        ["view"],
        ["serve"],
        ["dataset"],
        ["dataset", "register"],
        ["dataset", "pull"],
        ["dataset", "inspect"],
        ["dataset", "remove"],
        ["dataset", "list"],
        ["cookbook", "list"],
        ["cookbook", "info"],
        ["model", "init-tiny"],
        ["gateway"],
    ):
        code, out, _ = invoke(*args, "--help")
        assert code == 0 and "Example" in out, (args, out)


def test_gateway_passes_its_arguments_through(capsys: pytest.CaptureFixture[str]) -> None:
    from rllm.cli.main import main

    with pytest.raises(SystemExit):
        main(["gateway", "serve", "--help"])
    assert "--upstream" in capsys.readouterr().out


def test_cookbook_list_and_info() -> None:
    code, out, _ = invoke("cookbook", "list")
    assert code == 0 and "say-single" in out and "train, test" in out
    code, out, _ = invoke("cookbook", "info", "say-single")
    assert code == 0
    assert "train (8 tasks)" in out and "test (8 tasks)" in out
    assert "total_steps" in out and "rllm_cookbook_say" in out


def test_unknown_cookbook_is_a_one_line_error() -> None:
    code, _, err = invoke("cookbook", "info", "nope")
    assert code == 2
    assert "no cookbook named 'nope'" in err and "say-single" in err and "Traceback" not in err
    assert "hint:" in err


def test_debug_shows_the_traceback() -> None:
    code, _, err = invoke("--debug", "cookbook", "info", "nope")
    assert code == 2 and "Traceback" in err and "no cookbook named 'nope'" in err


def test_bad_config_key_names_it(tmp_path: Path) -> None:
    code, _, err = invoke("train", "say", "--out", str(tmp_path / "run"), "algorithm.nope=1")
    assert code == 2 and "algorithm.nope" in err


def test_dataset_round_trip(rllm_home: Path, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "words.jsonl", WORD_ROWS)
    code, _, err = invoke(
        "dataset", "register", "words", str(source), "--split", "test", "--id-column", "key"
    )
    assert code == 0 and "3 tasks" in err
    assert (rllm_home / "datasets" / "words" / "test.parquet").is_file()
    code, out, _ = invoke("dataset", "list")
    assert code == 0 and "words" in out and "test (3)" in out
    code, out, _ = invoke("dataset", "inspect", "words")
    assert code == 0 and "say: river" in out and "t1" in out and "question" in out
    from rllm.cli.registry import DatasetRegistry

    tasks = DatasetRegistry().load_tasks("words", "test")
    assert [t.id for t in tasks] == ["t0", "t1", "t2"]
    assert tasks[0].ground_truth == ["apple"] and tasks[0].metadata == {"words": ["apple"]}
    code, _, err = invoke("dataset", "remove", "words")
    assert code == 0 and not (rllm_home / "datasets" / "words").exists()
    code, _, err = invoke("dataset", "inspect", "words")
    assert code == 2 and "no registered dataset named 'words'" in err


def test_csv_and_parquet_register(rllm_home: Path, tmp_path: Path) -> None:
    csv = tmp_path / "q.csv"
    csv.write_text("problem,solution\nwhat is 2+2?,4\nwhat is 3+3?,6\n")
    code, _, err = invoke(
        "dataset",
        "register",
        "sums",
        str(csv),
        "--instruction-column",
        "problem",
        "--answer-column",
        "solution",
    )
    assert code == 0, err
    import datasets

    parquet = tmp_path / "q.parquet"
    datasets.Dataset.from_list([{"question": "hi", "answer": "x"}]).to_parquet(str(parquet))
    code, _, err = invoke("dataset", "register", "sums", str(parquet), "--split", "test")
    assert code == 0, err
    code, out, _ = invoke("dataset", "list")
    assert "train (2)" in out and "test (1)" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--instruction-column", "prompt"], "no column 'prompt' for instruction"),
        (["--answer-column", "solution"], "no column 'solution' for ground_truth"),
        (["--id-column", "uid"], "no column 'uid' for id"),
    ],
)
def test_a_bad_column_names_the_column_and_the_file(
    rllm_home: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    source = write_jsonl(tmp_path / "words.jsonl", WORD_ROWS)
    code, _, err = invoke("dataset", "register", "words", str(source), *args)
    assert code == 2 and message in err and str(source) in err
    assert "question" in err  # the columns that exist are listed
    assert not (rllm_home / "datasets" / "words").exists()


def test_bad_files_are_one_line_errors(rllm_home: Path, tmp_path: Path) -> None:
    code, _, err = invoke("dataset", "register", "x", str(tmp_path / "missing.jsonl"))
    assert code == 2 and "does not exist" in err
    odd = tmp_path / "data.txt"
    odd.write_text("hello")
    code, _, err = invoke("dataset", "register", "x", str(odd))
    assert code == 2 and "unsupported format '.txt'" in err
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"question": "a"}\n{not json\n')
    code, _, err = invoke("dataset", "register", "x", str(broken))
    assert code == 2 and str(broken) in err and "line 2 of" in err and "is not JSON" in err


def test_eval_a_cookbook_prints_a_summary_and_resumes(model_server: MockUpstream, tmp_path: Path) -> None:
    out = tmp_path / "eval"
    args = ["eval", "say-single", "--base-url", model_server.url, "--out", str(out), "--no-progress", *BYTES]
    code, stdout, err = invoke(*args, "--attempts", "2")
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_tasks"] == 8 and summary["num_rollouts"] == 16
    # Every word but 'lemon' is said right.
    assert summary["accuracy"] == pytest.approx(7 / 8)
    for label in ("accuracy", "pass@1", "pass@2", "latency s (p50 / p95 / max)", "termination: done"):
        assert label in stdout
    assert "0.875" in stdout
    code, stdout, err = invoke(*args, "--attempts", "2", "--resume")
    assert code == 0 and "8 resumed" in stdout
    assert len((out / "results.jsonl").read_text().splitlines()) == 8
    # `rllm view --table` on the eval folder prints its summary (it used to find no metrics.jsonl).
    code, stdout, err = invoke("view", str(out), "--table")
    assert code == 0, err
    assert "accuracy" in stdout and "0.875" in stdout and "pass@2" in stdout


def test_eval_max_examples(model_server: MockUpstream, tmp_path: Path) -> None:
    out = tmp_path / "eval"
    code, _, err = invoke(
        "eval",
        "say-single",
        "--base-url",
        model_server.url,
        "--out",
        str(out),
        "--max-examples",
        "3",
        "--no-progress",
    )
    assert code == 0, err
    assert json.loads((out / "summary.json").read_text())["num_tasks"] == 3


def test_eval_a_registered_dataset_with_a_cookbook_agent(
    rllm_home: Path, model_server: MockUpstream, tmp_path: Path
) -> None:
    source = write_jsonl(tmp_path / "words.jsonl", WORD_ROWS)
    assert invoke("dataset", "register", "words", str(source), "--split", "test")[0] == 0
    out = tmp_path / "eval"
    base = ["eval", "words", "--base-url", model_server.url, "--out", str(out), "--no-progress", *BYTES]
    code, _, err = invoke(*base)
    assert code == 2 and "needs --agent" in err
    code, _, err = invoke(*base, "--agent", "say-single")
    assert code == 0, err
    assert json.loads((out / "summary.json").read_text())["accuracy"] == pytest.approx(2 / 3)


def test_eval_of_an_unknown_name_lists_what_exists(rllm_home: Path) -> None:
    code, _, err = invoke("eval", "nope", "--base-url", "http://127.0.0.1:9/v1")
    assert code == 2 and "no cookbook or registered dataset named 'nope'" in err and "say-single" in err


def test_eval_without_an_endpoint_says_what_to_pass() -> None:
    code, _, err = invoke("eval", "say")
    assert code == 2 and "--base-url" in err


def test_eval_a_hosted_model_through_litellm(
    model_server: MockUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The loopback server stands in for the provider; LiteLLM speaks to it as to OpenAI.
    monkeypatch.setenv("RLLM_GATEWAY_HOSTED_API_KEY", "sk-test")
    out = tmp_path / "eval"
    code, stdout, err = invoke(
        "eval",
        "say-single",
        "--model",
        "openai/mock",
        "--api-base",
        model_server.url,
        "--out",
        str(out),
        "--max-examples",
        "2",
        "--no-progress",
        *BYTES,
    )
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_rollouts"] == 2 and summary["termination"] == {"done": 2}
    assert summary["accuracy"] == 1.0 and "accuracy" in stdout
