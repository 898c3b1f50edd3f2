"""Tokenizer consistency along SFT -> RL: stored token ids and checkpoints are used only with the
model whose tokenizer and shape they belong to, and the mismatch is refused before any work.

`rllm eval` against the mock model server (answering with the ids of tiny model A's tokenizer),
`rllm dataset from-eval` keeps those ids and records A's tokenizer, and `rllm sft` trains them
with A only: the default tiny model (a tokenizer built from the set's words) and model B (other
words) are refused before anything is built, unless --retokenize, which says what it does.
`rllm train --init-from` a checkpoint of another vocab size or tokenizer is refused before the
backend starts (it used to fail on an lm_head shape mismatch once everything had loaded).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from rllm.cli.main import cli
from rllm.engine.training.checkpoint import checkpoint_dir
from rllm.gateway.tokenizer_load import load_tokenizer
from rllm.testing import MockUpstream, say_back
from rllm.tiny import init_tiny_model

pytestmark = pytest.mark.slow

SFT = ["progress=false", "tensorboard=false", "total_steps=1", "backend.options.learning_rate=0.01"]


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.stderr


def test_stored_ids_train_only_the_model_whose_tokenizer_made_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLLM_HOME", str(tmp_path / "home"))
    model_a = init_tiny_model(tmp_path / "A", vocab_words=["apple", "lemon"], seed=0)
    model_b = init_tiny_model(tmp_path / "B", vocab_words=["river", "stone", "cloud"], seed=0)
    evals = tmp_path / "eval"
    upstream = MockUpstream(responder=say_back(), tokenizer=load_tokenizer(str(model_a))).start_in_thread()
    try:
        code, err = invoke(
            "eval", "say-single", "--base-url", upstream.url, "--out", str(evals), "--max-examples", "3",
            "--no-progress", "--max-tokens", "16",
        )  # fmt: skip
    finally:
        upstream.stop_in_thread()
    assert code == 0, err

    # An eval run does not know which model answered: the ids' tokenizer must be named.
    code, err = invoke("dataset", "from-eval", str(evals), "--name", "good")
    assert code == 2 and "--tokenizer" in err
    assert not (tmp_path / "home" / "sft" / "good").exists()
    assert invoke("dataset", "from-eval", str(evals), "--name", "good", "--tokenizer", str(model_a))[0] == 0
    rows = [
        json.loads(line)
        for line in (tmp_path / "home" / "sft" / "good" / "sft.jsonl").read_text().splitlines()
    ]
    from rllm.engine.training.model_check import tokenizer_fingerprint

    fingerprint = tokenizer_fingerprint(load_tokenizer(str(model_a)))
    assert rows and all(r["tokenizer"] == fingerprint and r["tokenizer_source"] == str(model_a) for r in rows)
    # The set exists: a second from-eval into its name is refused unless --overwrite.
    code, err = invoke("dataset", "from-eval", str(evals), "--name", "good", "--tokenizer", str(model_a))
    assert code == 2 and "already holds an SFT set" in err

    # The default tiny model builds its tokenizer from the set's words: refused before it is built.
    tiny_out = tmp_path / "sft-tiny"
    code, err = invoke("sft", "good", "--out", str(tiny_out), *SFT)
    assert code == 2 and f"--model {model_a}" in err and "--retokenize" in err, err
    assert not tiny_out.exists()
    # Another model's tokenizer: refused, naming both, before any weights load or step runs.
    other_out = tmp_path / "sft-b"
    code, err = invoke("sft", "good", "--model", str(model_b), "--out", str(other_out), *SFT)
    assert code == 2 and fingerprint in err and "tokenizes differently" in err, err
    assert not (other_out / "checkpoints").exists()
    # The model that made them trains on them; another one only when asked to retokenize.
    code, err = invoke("sft", "good", "--model", str(model_a), "--out", str(tmp_path / "sft-a"), *SFT)
    assert code == 0, err
    code, err = invoke("sft", "good", "--model", str(model_b), "--out", str(other_out), "--retokenize", *SFT)
    assert code == 0, err
    assert "warning" in err and "tokenizing their messages with this run's tokenizer" in err


def _checkpoint_of(model: Path, run: Path) -> Path:
    """A full fine-tuning checkpoint of ``model``: its backend/ is a model folder, as the tinker
    backend saves one."""
    ckpt = checkpoint_dir(run, 1)
    shutil.copytree(model, ckpt / "backend")
    (ckpt / "trainer_state.json").write_text('{"step": 1}')
    return ckpt


@pytest.mark.parametrize(
    ("words", "model", "message"),
    [
        (["alpha", "beta", "delta"], "A", "vocab size"),  # one word more
        (["alpha", "gamma"], "A", "tokenizer"),  # as many words, others
        (["alpha", "beta", "delta"], "tiny", "vocab size"),  # the run's own tiny model
    ],
    ids=["vocab-size", "tokenizer", "tiny"],
)
def test_init_from_another_models_checkpoint_is_refused_before_the_backend_starts(
    tmp_path: Path, words: list[str], model: str, message: str
) -> None:
    model_a = init_tiny_model(tmp_path / "A", vocab_words=["alpha", "beta"], seed=0)
    other = init_tiny_model(tmp_path / "other", vocab_words=words, seed=0)
    run = tmp_path / "sft"
    _checkpoint_of(other, run)
    out = tmp_path / "rl"
    flags = [f"backend.options.model={model_a}"] if model == "A" else []
    code, err = invoke(
        "train", "say-single", "--out", str(out), "--init-from", str(run), "total_steps=1", *flags
    )
    assert code == 2, err
    assert "config key `init_from`" in err and message in err and f"backend.options.model={run}" in err, err
    assert not (out / "metrics.jsonl").exists() and not (out / "checkpoints").exists()
