"""Mistakes refused before any work, each in one line naming its cause (issue #49, "Checked before
work"): the CLI in-process, as a user types it, with real folders. Every refusal here used to
start the run (seconds of start-up, or a whole run that learnt nothing) or fail for another cause.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from rllm.cli.main import cli
from rllm.engine.training.trainer_config import config_from_dict

QUICK = ["tasks_per_step=2", "val_every=0", "rollout.workers=1", "progress=false", "total_steps=1"]


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def refused(out: Path, *args: str) -> str:
    """``args`` exit 2 with one line, and nothing is written to ``out``."""
    code, _, err = invoke(*args)
    assert code == 2, err
    assert err.startswith("error: ") and len(err.strip().splitlines()) <= 2, err  # the line (+ a hint)
    assert not out.exists(), sorted(p.name for p in out.iterdir())
    return err


@pytest.fixture
def chats(tmp_path: Path) -> Path:
    path = tmp_path / "chats.jsonl"
    turn = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    path.write_text(json.dumps({"messages": turn}) + "\n")
    return path


def test_one_rollout_per_task_leaves_a_group_estimator_nothing_to_learn_from(tmp_path: Path) -> None:
    out = tmp_path / "run"
    err = refused(out, "train", "say-single", "--out", str(out), *QUICK, "group_size=1")
    assert "group_size=1 leaves algorithm.estimator=grpo no group baseline" in err
    err = refused(
        out, "train", "say-single", "--out", str(out), *QUICK, "group_size=1", "algorithm.estimator=rloo"
    )
    assert "algorithm.estimator=rloo" in err
    # An estimator without a group baseline samples once per task, as does distillation.
    config_from_dict({"cookbook": "say", "group_size": 1, "algorithm": {"estimator": "reinforce"}})
    config_from_dict({"cookbook": "say", "group_size": 1, "distill": {"teacher": "http://127.0.0.1:9/v1"}})


def test_an_sft_key_without_sft_names_the_flag(tmp_path: Path) -> None:
    out = tmp_path / "run"
    err = refused(out, "train", "say-single", "--out", str(out), *QUICK, "sft.epochs=3")
    assert "sft.epochs" in err and "--sft" in err


@pytest.mark.parametrize(
    ("args", "key"),
    [
        (["train", "say-single", "--backend", "tinker", "backend.name=verl"], "backend.name"),
        (["sft", "CHATS", "--model", "./a", "backend.options.model=./b"], "backend.options.model"),
        (["sft", "CHATS", "--backend", "tinker", "backend.name=fireworks"], "backend.name"),
    ],
    ids=["train-backend", "sft-model", "sft-backend"],
)
def test_a_flag_and_an_override_of_its_key_that_disagree_are_a_conflict(
    tmp_path: Path, chats: Path, args: list[str], key: str
) -> None:
    out = tmp_path / "run"
    args = [str(chats) if a == "CHATS" else a for a in args]
    err = refused(out, *args, "--out", str(out), *QUICK[-1:])
    assert key in err and "disagree" in err


def test_a_dataset_named_like_a_cookbook_is_refused(rllm_home: Path, tmp_path: Path) -> None:
    source = tmp_path / "tasks.jsonl"
    source.write_text(json.dumps({"question": "q", "answer": "a"}) + "\n")
    err = refused(rllm_home / "datasets", "dataset", "register", "say", str(source))
    assert "'say' is a cookbook" in err and "another name" in err


def test_from_eval_sets_are_listed(rllm_home: Path) -> None:
    folder = rllm_home / "sft" / "good"
    folder.mkdir(parents=True)
    (folder / "sft.jsonl").write_text('{"input_ids": [1, 2], "loss_mask": [0, 1]}\n' * 3)
    record = {"kind": "dataset from-eval", "command": [], "config": {"tokenizer_source": "m"}}
    (folder / "rllm-run.json").write_text(json.dumps({**record, "started": "", "rllm_version": "0"}))
    (rllm_home / "sft" / "older.jsonl").write_text('{"input_ids": [1], "loss_mask": [1]}\n')
    code, out, err = invoke("dataset", "list")
    assert code == 0, err
    rows = {line.split("│")[1].strip(): line for line in out.splitlines() if line.count("│") > 3}
    assert "3" in rows["good"] and "older" in rows, out


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["eval", "say-single", "--base-url", "http://127.0.0.1:9"], "has no path"),
        (["eval", "say-single", "--base-url", "http://127.0.0.1:9/v1/chat/completions"], "is an endpoint"),
        (["distill", "say-single", "--teacher", "http://127.0.0.1:9/", *QUICK], "has no path"),
    ],
    ids=["eval-bare-host", "eval-endpoint", "distill-bare-host"],
)
def test_a_base_url_without_v1_says_which_to_pass(tmp_path: Path, args: list[str], says: str) -> None:
    out = tmp_path / "out"
    err = refused(out, *args, "--out", str(out))
    assert says in err and "pass http://127.0.0.1:9/v1" in err


@pytest.mark.parametrize(
    "args",
    [
        ["train", "say-single", *QUICK, "backend.options.model=MISSING"],
        ["sft", "CHATS", "--model", "MISSING"],
    ],
    ids=["train", "sft"],
)
def test_a_model_path_that_does_not_exist_is_said_to_not_exist(
    tmp_path: Path, chats: Path, args: list[str]
) -> None:
    out, missing = tmp_path / "run", str(tmp_path / "models" / "trained")
    args = [a.replace("MISSING", missing).replace("CHATS", str(chats)) for a in args]
    err = refused(out, *args, "--out", str(out))
    assert f"{missing} does not exist" in err and "Repo id" not in err


@pytest.mark.parametrize(
    ("args", "allowed"),
    [
        (
            ["train", "say-single", *QUICK, "backend.options.dtype=bf17"],
            "'auto', 'bfloat16', 'float16', 'float32'",
        ),
        (["train", "say-single", *QUICK, "backend.options.service=cloud"], "'local', 'remote'"),
        (
            ["distill", "say-single", "--teacher", "http://127.0.0.1:9/v1", *QUICK, "distill.loss=topK"],
            "'sampled', 'topk'",
        ),
    ],
    ids=["dtype", "service", "distill-loss"],
)
def test_an_enum_value_that_is_not_one_lists_the_allowed_ones(
    tmp_path: Path, args: list[str], allowed: str
) -> None:
    out = tmp_path / "run"
    err = refused(out, *args, "--out", str(out))
    assert f"allowed: {allowed}" in err


def test_a_backend_whose_extra_is_not_installed_names_the_install(tmp_path: Path) -> None:
    import importlib.util

    if importlib.util.find_spec("verl") is not None and importlib.util.find_spec("tensordict") is not None:
        pytest.skip("verl's extra is installed here")
    out = tmp_path / "run"
    model = tmp_path / "model"
    model.mkdir()
    err = refused(
        out,
        "train",
        "say-single",
        "--out",
        str(out),
        *QUICK,
        "--backend",
        "verl",
        f"backend.options.model={model}",
    )
    assert "backend 'verl' needs" in err and "pip install 'rllm-backend-verl[verl]'" in err


def test_a_device_that_is_not_one_is_refused_by_its_key(tmp_path: Path) -> None:
    out = tmp_path / "run"
    err = refused(out, "train", "say-single", "--out", str(out), *QUICK, "backend.options.device=cdua")
    assert "backend.options.device" in err and "'cdua' is not a device" in err


def test_a_ray_address_nobody_answers_at_is_refused_before_the_run_folder(tmp_path: Path) -> None:
    import socket

    with socket.socket() as probe:  # a port that was free a moment ago: nobody listens there now
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = tmp_path / "run"
    address = f"127.0.0.1:{port}"
    ray = ["rollout.executor=ray", f"rollout.ray.address={address}", "rollout.ray.num_workers=1"]
    err = refused(out, "train", "say-single", "--out", str(out), *QUICK, *ray)
    assert f"rollout.ray.address '{address}' does not answer" in err, err
