"""`rllm export` and `rllm serve` take what a run leaves: a run folder or one of its checkpoints.

The export test trains the tiny model for real (tinker local service, LoRA and full fine-tuning),
saves a trainer checkpoint, exports it, loads the folder with plain transformers (and PEFT for
``--adapter-only``) and checks its logprobs equal the trainer's on a few sequences.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from rllm.algos.config import AlgorithmConfig
from rllm.cli.main import cli
from rllm.cli.run_model import resolve_run_model
from rllm.engine.backend import TrainSequence
from rllm.engine.training.checkpoint import TrainerState, checkpoint_dir, save_checkpoint
from rllm.types import FloatArray, TokenArray

WORDS = ["apple", "river", "lemon", "stone"]


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.stderr


def _checkpoint(run: Path, step: int) -> Path:
    ckpt = checkpoint_dir(run, step)
    (ckpt / "backend").mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text(f'{{"step": {step}}}')
    return ckpt


def test_a_run_folder_means_its_latest_checkpoint_named_after_run_and_step(tmp_path: Path) -> None:
    run = tmp_path / "say"
    _checkpoint(run, 10)
    _checkpoint(run, 20)
    model = resolve_run_model(run)
    assert model.path == checkpoint_dir(run, 20) / "backend" and model.name == "say-step20"
    assert resolve_run_model(run, step=10).name == "say-step10"
    assert resolve_run_model(checkpoint_dir(run, 10)).name == "say-step10"
    assert resolve_run_model(checkpoint_dir(run, 10) / "backend").name == "say-step10"


@pytest.mark.parametrize(
    ("setup", "args", "message"),
    [
        (lambda p: None, [], "does not exist"),
        (lambda p: p.mkdir(), [], "is not a model"),
        (lambda p: (p / "checkpoints").mkdir(parents=True), [], "has no checkpoint yet"),
        (lambda p: _checkpoint(p, 10), ["--step", "5"], "no checkpoint of step 5 (steps: 10)"),
    ],
)
def test_serve_and_export_say_what_the_path_is_not(
    tmp_path: Path, setup: Any, args: list[str], message: str
) -> None:
    path = tmp_path / "run"
    setup(path)
    for command in (["serve", str(path)], ["export", str(path), "--to", str(tmp_path / "out")]):
        code, err = invoke(*command, *args)
        assert code == 2 and message in err, (command, err)
        assert "config.json" not in err or "is not a model" in err


def _sequence(tokenizer: Any, word: str, reply: str, advantage: float) -> TrainSequence:
    prompt = tokenizer(f"say: {word}", add_special_tokens=False)["input_ids"]
    response = [*tokenizer(reply, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
    tokens = prompt + response
    return TrainSequence(
        input_ids=TokenArray(tokens),
        loss_mask=FloatArray([0.0] * len(prompt) + [1.0] * len(response)),
        advantages=FloatArray([advantage] * len(tokens)),
        sampler_logprobs=FloatArray([0.0] * len(tokens)),
    )


def _logprobs(model: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    device = next(model.parameters()).device
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([tokens], device=device)).logits[0, :-1].float()
        logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(-1, torch.tensor(tokens[1:], device=device)[:, None]).squeeze(-1).cpu()


async def _train_and_checkpoint(base: Path, run: Path, lora_rank: int) -> list[torch.Tensor]:
    from rllm.backends.tinker import TinkerBackend

    options = {"model": str(base), "dtype": "float32", "torch_threads": 2, "learning_rate": 5e-2}
    backend = TinkerBackend({**options, "lora": {"rank": lora_rank, "alpha": 8}})
    await backend.start()
    try:
        tokenizer = backend.service.tokenizer
        batch = [_sequence(tokenizer, w, w, 1.0) for w in WORDS[:2]] + [
            _sequence(tokenizer, w, "stone", -1.0) for w in WORDS[:2]
        ]
        for _ in range(3):  # LoRA's B starts at zero: train, so the merge has something to merge
            await backend.train_step(batch, AlgorithmConfig(loss="importance_sampling"))
        await save_checkpoint(run, TrainerState(step=3), backend.save_checkpoint)
        trainer_model = backend.service.trainer.model
        return [_logprobs(trainer_model, list(seq.input_ids)) for seq in batch]
    finally:
        await backend.close()


@pytest.mark.parametrize("lora_rank", [4, 0], ids=["lora-merged", "full"])
def test_an_exported_checkpoint_loads_in_transformers_with_the_trainers_logprobs(
    tmp_path: Path, lora_rank: int
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rllm.tiny import init_tiny_model

    base = init_tiny_model(tmp_path / "base", vocab_words=WORDS, seed=0)
    run = tmp_path / "say"
    expected = asyncio.run(_train_and_checkpoint(base, run, lora_rank))
    out = tmp_path / "exported"
    code, err = invoke("export", str(run), "--to", str(out))
    assert code == 0, err
    assert "say-step3" in err
    assert not (out / "optimizer.pt").exists() and not (out / "rllm_backend_state.json").exists()
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    base_model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32).eval()
    # The batch's sequences, rebuilt from the exported tokenizer (the same ids: it is the base's).
    pairs = [(WORDS[0], WORDS[0]), (WORDS[1], WORDS[1]), (WORDS[0], "stone"), (WORDS[1], "stone")]
    tokens_list = [list(_sequence(tokenizer, w, r, 0.0).input_ids) for w, r in pairs]
    for want, tokens in zip(expected, tokens_list, strict=True):
        got = _logprobs(model, tokens)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        assert not torch.allclose(_logprobs(base_model, tokens), want, atol=1e-3)  # training moved it
    if lora_rank:
        from peft import PeftModel

        adapter = tmp_path / "adapter"
        code, err = invoke("export", str(run), "--to", str(adapter), "--adapter-only")
        assert code == 0, err
        assert (adapter / "adapter_config.json").is_file() and not (adapter / "config.json").exists()
        fresh = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32).eval()
        peft_model = PeftModel.from_pretrained(fresh, str(adapter)).eval()
        torch.testing.assert_close(_logprobs(peft_model, tokens_list[0]), expected[0], atol=1e-4, rtol=1e-4)
    else:
        code, err = invoke("export", str(run), "--to", str(tmp_path / "a"), "--adapter-only")
        assert code == 2 and "drop --adapter-only" in err


def test_export_over_an_adapter_only_export_leaves_no_adapter_behind(tmp_path: Path) -> None:
    """--overwrite (and --force, its deprecated name) replaces the earlier export whole: an
    adapter left beside merged weights would make loaders apply it twice."""
    from transformers import AutoModelForCausalLM

    from rllm.tiny import init_tiny_model

    base = init_tiny_model(tmp_path / "base", vocab_words=WORDS, seed=0)
    run = tmp_path / "say"
    asyncio.run(_train_and_checkpoint(base, run, lora_rank=4))
    out = tmp_path / "exported"
    assert invoke("export", str(run), "--to", str(out), "--adapter-only")[0] == 0
    assert (out / "adapter_config.json").is_file()
    code, err = invoke("export", str(run), "--to", str(out))
    assert code == 2 and "already holds an exported model" in err and "--overwrite" in err
    code, err = invoke("export", str(run), "--to", str(out), "--force")
    assert code == 0, err
    assert "--force is deprecated" in err
    left = sorted(p.name for p in out.iterdir())
    assert not [name for name in left if name.startswith("adapter_")], left
    clean = tmp_path / "clean"
    assert invoke("export", str(run), "--to", str(clean))[0] == 0
    assert left == sorted(p.name for p in clean.iterdir())  # the same files as a fresh export
    tokens = [3, 4, 5, 6]
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    fresh = AutoModelForCausalLM.from_pretrained(str(clean), dtype=torch.float32).eval()
    torch.testing.assert_close(_logprobs(model, tokens), _logprobs(fresh, tokens))
    # --overwrite, back to the adapter alone: no merged weights left beside it either.
    assert invoke("export", str(run), "--to", str(out), "--adapter-only", "--overwrite")[0] == 0
    assert not (out / "config.json").exists() and not (out / "model.safetensors").exists()


def test_export_overwrite_never_empties_a_folder_of_the_users_files(tmp_path: Path) -> None:
    run = tmp_path / "say"
    _checkpoint(run, 1)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    code, err = invoke("export", str(run), "--to", str(mine), "--overwrite")
    assert code == 2 and "files no rLLM command wrote" in err
    assert (mine / "notes.txt").read_text() == "keep"
