"""The run-folder contract, as a user meets it: every command that writes a folder refuses an
earlier result unless --resume or --overwrite, refuses --resume with nothing to resume or with
other settings (naming the keys), and refuses another command's folder by name
(docs/run-folders.md). Real folders and the CLI in-process; the evaluations run against the mock
model server on loopback.
"""

from __future__ import annotations

import json
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from rllm.cli.main import cli
from rllm.engine.training.checkpoint import checkpoint_dir
from rllm.engine.training.metrics_log import read_metrics
from rllm.testing import MockUpstream

EVAL = ["--max-examples", "2", "--no-progress", "--max-tokens", "16"]
QUICK = ["tasks_per_step=2", "group_size=2", "val_every=0", "rollout.workers=1", "progress=false"]
QUICK += ["plot=false", "tensorboard=false", "sample_groups=1"]


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def evaluate(out: Path, url: str, *flags: str, name: str = "say-single") -> tuple[int, str, str]:
    return invoke("eval", name, "--out", str(out), "--base-url", url, *EVAL, *flags)


@pytest.fixture(scope="module")
def server() -> Iterator[MockUpstream]:
    from rllm.testing import say_back

    upstream = MockUpstream(responder=say_back()).start_in_thread()
    yield upstream
    upstream.stop_in_thread()


@pytest.fixture(scope="module")
def finished_eval(server: MockUpstream, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One evaluation of say-single (2 tasks, all right), copied by each test that needs it."""
    out = tmp_path_factory.mktemp("evals") / "eval"
    code, _, err = evaluate(out, server.url)
    assert code == 0, err
    return out


@pytest.fixture
def dead_url() -> Iterator[str]:
    sock = socket.socket()  # bound, never listening: every connection is refused
    sock.bind(("127.0.0.1", 0))
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    sock.close()


def _copy(folder: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(folder, tmp_path / folder.name))


@pytest.mark.parametrize(
    ("flags", "key"),
    [
        (["--base-url", "DEAD"], "base_url"),
        (["--model", "another-model"], "model"),
        (["--temperature", "0.7"], "temperature"),
        (["--max-tokens", "8"], "max_tokens"),
        (["COOKBOOK", "say"], "name"),
    ],
    ids=["endpoint", "model", "temperature", "max-tokens", "cookbook"],
)
def test_eval_into_a_folder_with_results_never_shows_them_as_new(
    finished_eval: Path, server: MockUpstream, dead_url: str, tmp_path: Path, flags: list[str], key: str
) -> None:
    out = _copy(finished_eval, tmp_path)
    before = (out / "results.jsonl").read_bytes()
    name = flags[1] if flags[0] == "COOKBOOK" else "say-single"
    url = dead_url if flags[1] == "DEAD" else server.url
    extra = [] if flags[0] in ("COOKBOOK", "--base-url") else flags
    # Run again with other settings: refused, where it used to print the earlier results as its own.
    code, stdout, err = evaluate(out, url, *extra, name=name)
    assert code == 2, stdout + err
    assert "already holds an evaluation" in err and "--resume" in err and "--overwrite" in err
    # --resume with other settings: refused, naming what differs.
    code, _, err = evaluate(out, url, *extra, "--resume", name=name)
    assert code == 2 and f"{key} (run: " in err, err
    assert (out / "results.jsonl").read_bytes() == before  # never mixed with other results


def test_eval_resumes_the_same_settings_and_overwrite_replaces_everything(
    finished_eval: Path, server: MockUpstream, tmp_path: Path
) -> None:
    out = _copy(finished_eval, tmp_path)
    code, stdout, err = evaluate(out, server.url, "--resume")
    assert code == 0 and "2 resumed" in stdout, err
    # Another cookbook into the same folder: only its results are there after --overwrite.
    code, _, err = invoke(
        "eval", "say", "--out", str(out), "--base-url", server.url, *EVAL[:2], "--overwrite"
    )
    assert code == 0, err
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    record = json.loads((out / "rllm-run.json").read_text())
    assert record["kind"] == "eval" and record["config"]["name"] == "say"
    episodes = (out / "episodes.jsonl").read_text().splitlines()
    assert len(rows) == 2 and len(episodes) == 2  # not 4: the earlier evaluation is gone whole


@pytest.mark.parametrize("command", ["eval", "sft"])
def test_resume_with_nothing_to_resume_is_refused(command: str, server: MockUpstream, tmp_path: Path) -> None:
    out = tmp_path / "never-ran"
    chats = tmp_path / "chats.jsonl"
    chats.write_text(
        json.dumps({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})
    )
    args = {
        "eval": ["eval", "say-single", "--base-url", server.url, *EVAL],
        "sft": ["sft", str(chats), "progress=false"],
    }[command]
    code, _, err = invoke(*args, "--out", str(out), "--resume")
    assert code == 2 and "--resume" in err and "does not exist (nothing to resume)" in err, err
    assert not out.exists()  # nothing built, nothing written


def _record(path: Path, kind: str) -> None:
    """The record a command leaves (rllm-run.json), as it is on disk."""
    path.mkdir(parents=True, exist_ok=True)
    record = {"kind": kind, "command": ["rllm", kind], "config": {}, "started": "", "rllm_version": "0"}
    (path / "rllm-run.json").write_text(json.dumps(record))


def _eval_folder(path: Path) -> None:
    _record(path, "eval")
    (path / "results.jsonl").write_text(
        '{"task_id": "t", "attempts": [], "num_correct": 0, "mean_reward": 0.0}\n'
    )


def _train_folder(path: Path) -> None:
    _record(path, "train")
    (path / "metrics.jsonl").write_text('{"step": 1}\n')


def _legacy_eval_folder(path: Path) -> None:  # written before folders had records
    path.mkdir(parents=True)
    (path / "results.jsonl").write_text("")
    (path / "summary.json").write_text("{}")


def _export_folder(path: Path) -> None:
    _record(path, "export")
    (path / "config.json").write_text("{}")


@pytest.mark.parametrize(
    ("make", "args", "writer"),
    [
        (_eval_folder, ["train", "say-single", "total_steps=1"], "written by `rllm eval`"),
        (_legacy_eval_folder, ["train", "say-single", "total_steps=1", "--overwrite"], "an evaluation"),
        (_train_folder, ["eval", "say-single", "--base-url", "URL", *EVAL], "written by `rllm train`"),
        (_train_folder, ["sft", "CHATS", "total_steps=1"], "written by `rllm train`"),
        (_eval_folder, ["sft", "CHATS", "total_steps=1"], "written by `rllm eval`"),
        (_export_folder, ["model", "init-tiny", "OUT", "--overwrite"], "written by `rllm export`"),
        (_eval_folder, ["export", "RUN", "--to", "OUT", "--overwrite"], "written by `rllm eval`"),
        (_eval_folder, ["model", "import", "GGUF", "--out", "OUT", "--overwrite"], "written by `rllm eval`"),
    ],
    ids=[
        "eval->train",
        "old-eval->train",
        "train->eval",
        "train->sft",
        "eval->sft",
        "export->init-tiny",
        "eval->export",
        "eval->import",
    ],
)
def test_another_commands_folder_is_refused_by_name(
    server: MockUpstream, tmp_path: Path, make, args: list[str], writer: str
) -> None:
    out = tmp_path / "folder"
    make(out)
    before = sorted(p.name for p in out.iterdir())
    chats = tmp_path / "chats.jsonl"
    chats.write_text(
        json.dumps({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})
    )
    run = tmp_path / "run"
    (checkpoint_dir(run, 1) / "backend").mkdir(parents=True)
    (checkpoint_dir(run, 1) / "trainer_state.json").write_text('{"step": 1}')
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    subs = {"URL": server.url, "CHATS": str(chats), "OUT": str(out), "RUN": str(run), "GGUF": str(gguf)}
    args = [subs.get(a, a) for a in args]
    if args[0] not in ("model", "export"):
        args += ["--out", str(out)]
    code, _, err = invoke(*args)
    assert code == 2, err
    assert writer in err and "another command's folder" in err, err
    assert sorted(p.name for p in out.iterdir()) == before  # nothing written into it


@pytest.mark.slow
def test_train_resume_with_another_config_names_the_keys(tmp_path: Path) -> None:
    out = tmp_path / "run"
    run = ["train", "say-single", "--out", str(out), *QUICK, "backend.options.learning_rate=0.001"]
    code, _, err = invoke(*run, "total_steps=1")
    assert code == 0, err
    model = (out / "tiny-model" / "model.safetensors").read_bytes()
    resume = [*run, "--resume"]

    code, _, err = invoke(*resume, "total_steps=2", "backend.options.learning_rate=0.01")
    assert code == 2
    assert (
        "total_steps (run: 1, now: 2)" in err
        and "backend.options.learning_rate (run: 0.001, now: 0.01)" in err
    )
    assert "--allow-changes total_steps" in err and "backend.options.learning_rate cannot change" in err
    code, _, err = invoke(*resume, "--allow-changes", "backend.options.learning_rate", "total_steps=1")
    assert code == 2 and "not a key --resume may change" in err and "total_steps" in err
    code, _, err = invoke(*resume, "--init-from", str(out), "total_steps=1")
    assert code == 2 and "--init-from only starts a new run" in err
    code, _, err = invoke(*resume, "--agent", "say-duo", "total_steps=1")  # the same tasks, another agent
    assert code == 2 and "agent (run: " in err, err
    # What may change goes through when named, and the run goes on from its checkpoint.
    code, _, err = invoke(*resume, "--allow-changes", "total_steps", "total_steps=2")
    assert code == 0, err
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2]
    record = json.loads((out / "rllm-run.json").read_text())
    assert record["config"]["total_steps"] == 2 and record["resumes"][0]["changed"] == {"total_steps": [1, 2]}
    assert (out / "tiny-model" / "model.safetensors").read_bytes() == model  # the same model, kept
    # A finished run resumed: nothing to do, said at once (exit 0), nothing started or written.
    stamp = (out / "rllm-run.json").read_text()
    code, _, err = invoke(*resume, "total_steps=2")
    assert code == 0 and "finished at step 2 (total_steps=2): nothing to resume" in err, err
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2]
    assert (out / "rllm-run.json").read_text() == stamp


def test_init_tiny_never_writes_over_a_model(tmp_path: Path) -> None:
    path = tmp_path / "model"
    code, _, err = invoke("model", "init-tiny", str(path), "--cookbook", "say-single")
    assert code == 0 and "written" in err
    (path / "model.safetensors").write_bytes(b"trained weights")  # a model that is not the one built
    stamp = sorted((p.name, p.read_bytes()) for p in path.iterdir() if p.is_file())
    code, _, err = invoke("model", "init-tiny", str(path), "--cookbook", "say")
    assert code == 2 and "already holds a tiny model" in err and "--overwrite" in err
    assert sorted((p.name, p.read_bytes()) for p in path.iterdir() if p.is_file()) == stamp
    # A model folder from elsewhere (no record): refused as well, replaced only with --overwrite.
    (path / "rllm-run.json").unlink()
    assert invoke("model", "init-tiny", str(path))[0] == 2
    code, _, err = invoke("model", "init-tiny", str(path), "--overwrite")
    assert code == 0, err
    assert (path / "model.safetensors").read_bytes() != b"trained weights"
    assert json.loads((path / "rllm-run.json").read_text())["config"]["cookbook"] == "say"
    # --overwrite empties only a model folder, never a folder of the user's own files.
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    code, _, err = invoke("model", "init-tiny", str(mine), "--overwrite")
    assert code == 2 and "files no rLLM command wrote" in err and (mine / "notes.txt").read_text() == "keep"


def test_model_import_records_its_folder_and_other_commands_refuse_it(tmp_path: Path) -> None:
    from rllm.testing.gguf_files import write_tiny_llama

    gguf = write_tiny_llama(tmp_path / "tiny.gguf")
    out = tmp_path / "model"
    code, _, err = invoke("model", "import", str(gguf), "--out", str(out), "--dtype", "float32")
    assert code == 0, err
    record = json.loads((out / "rllm-run.json").read_text())
    assert record["kind"] == "model import" and record["config"]["dtype"] == "float32"
    code, _, err = invoke("model", "import", str(gguf), "--out", str(out))
    assert code == 2 and "already holds an imported model" in err and "--overwrite" in err, err
    code, _, err = invoke("model", "init-tiny", str(out), "--overwrite")  # another model writer
    assert code == 2 and "written by `rllm model import`" in err, err
    code, _, err = invoke("model", "import", str(gguf), "--out", str(out), "--overwrite")
    assert code == 0, err
    assert json.loads((out / "rllm-run.json").read_text())["config"]["dtype"] == "bf16"


def test_model_import_replaces_whole_and_never_calls_user_files_a_model(tmp_path: Path) -> None:
    from rllm.testing.gguf_files import write_tiny_llama

    gguf = write_tiny_llama(tmp_path / "tiny.gguf")
    out = tmp_path / "model"
    assert invoke("model", "import", str(gguf), "--out", str(out), "--dtype", "float32")[0] == 0
    (out / "adapter_config.json").write_text("{}")  # an earlier writer's file beside the model
    code, _, err = invoke("model", "import", str(gguf), "--out", str(out), "--resume")
    assert code == 2 and "--resume" in err, err  # the table's "—": it cannot resume
    code, _, err = invoke(
        "model", "import", str(gguf), "--out", str(out), "--overwrite", "--dtype", "float32"
    )
    assert code == 0, err
    assert not (out / "adapter_config.json").exists()  # replaced whole: nothing stale left
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    for flags in ([], ["--overwrite"]):
        code, _, err = invoke("model", "import", str(gguf), "--out", str(mine), *flags)
        assert code == 2 and "files no rLLM command wrote (notes.txt" in err, err
        assert "already holds" not in err, err  # notes are not "an imported model"
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


def test_from_eval_set_follows_the_folder_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`rllm dataset from-eval` as docs/run-folders.md's row says: a fresh name is written, an
    existing set is refused, --resume is no option, --overwrite replaces the set whole, and a
    folder another command wrote under the set's name is refused by name."""
    from rllm.gateway.tokenizer_load import load_tokenizer
    from rllm.testing import say_back
    from rllm.tiny import init_tiny_model

    monkeypatch.setenv("RLLM_HOME", str(tmp_path / "home"))
    model = init_tiny_model(tmp_path / "model", vocab_words=["apple", "lemon"], seed=0)
    upstream = MockUpstream(responder=say_back(), tokenizer=load_tokenizer(str(model))).start_in_thread()
    try:
        code, _, err = evaluate(tmp_path / "eval", upstream.url)
    finally:
        upstream.stop_in_thread()
    assert code == 0, err
    make = ["dataset", "from-eval", str(tmp_path / "eval"), "--tokenizer", str(model), "--name"]
    sets = tmp_path / "home" / "sft"
    code, _, err = invoke(*make, "good")
    assert code == 0, err
    assert sorted(p.name for p in (sets / "good").iterdir()) == ["rllm-run.json", "sft.jsonl"]
    code, _, err = invoke(*make, "good")
    assert code == 2 and "already holds an SFT set" in err and "--overwrite" in err, err
    code, _, err = invoke(*make, "good", "--resume")
    assert code == 2 and "--resume" in err, err
    (sets / "good" / "stale.jsonl").write_text("{}\n")  # an earlier version's file in the set
    code, _, err = invoke(*make, "good", "--overwrite")
    assert code == 0, err
    assert sorted(p.name for p in (sets / "good").iterdir()) == ["rllm-run.json", "sft.jsonl"]
    _eval_folder(sets / "evals")
    code, _, err = invoke(*make, "evals", "--overwrite")
    assert code == 2 and "written by `rllm eval`" in err and "another command's folder" in err, err
    assert sorted(p.name for p in (sets / "evals").iterdir()) == ["results.jsonl", "rllm-run.json"]
