"""`rllm sft DATA --backend verl` on the CPU: no sampler (``rollout.engine = "none"``), one rank,
so verl's FSDP2 ``TrainingWorker`` runs in the CLI's process without Ray; rllm.algos'
``cross_entropy`` over the assistant tokens inside verl's engine, a verl checkpoint at the last
step that ``rllm export`` turns into a model whose answers are likelier than the untrained model's.
The same run takes a held-out loss every ``val_every`` steps (a forward-only pass of verl's
workers) and an LR schedule with warmup, set on verl's optimizer each step and read back from it.

The CLI runs in a subprocess: its process group and environment stay out of this pytest process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# Named on its own in the workspace env (no verl there), the file skips; nox -s verl runs it.
pytest.importorskip("verl")
pytest.importorskip("rllm.cli", reason="the rllm CLI is not installed in this environment")

import torch

from rllm.engine.data.sft import lr_scale
from rllm.engine.training.metrics_log import read_metrics

pytestmark = [pytest.mark.verl, pytest.mark.slow]

FRUITS = ["apple", "banana", "cherry"]
SYSTEM, HELD_OUT_SYSTEM = "repeat the word", "say the word"  # held-out: another instruction
LR = 0.01
RUN_TIMEOUT_S = 900  # generous: the machine may be loaded; the run takes about a minute


def _chat(fruit: str, system: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": f"say {fruit}"},
        {"role": "assistant", "content": fruit},
    ]


def _write_chats(path: Path, system: str = SYSTEM) -> Path:
    rows = [
        {
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": f"say {fruit}"},
                {"role": "assistant", "content": fruit},
            ]
        }
        for fruit in FRUITS
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _answer_nll(model: Path) -> float:
    """Mean NLL of each answer's tokens after its prompt, under the model (transformers, fp32)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    policy = AutoModelForCausalLM.from_pretrained(model, torch_dtype=torch.float32).eval()
    total, count = 0.0, 0
    for fruit in FRUITS:
        messages = [
            {"role": "system", "content": "repeat the word"},
            {"role": "user", "content": f"say {fruit}"},
        ]
        encoded = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=True
        )
        prompt = list(encoded["input_ids"])
        answer = tokenizer.encode(fruit, add_special_tokens=False)
        ids = torch.tensor([prompt + answer])
        with torch.no_grad():
            log_probs = torch.log_softmax(policy(input_ids=ids).logits[0, :-1].float(), dim=-1)
        targets = ids[0, len(prompt) :]
        total -= log_probs[len(prompt) - 1 :].gather(-1, targets[:, None]).sum().item()
        count += len(answer)
    return total / count


def _held_out_nll(model: Path) -> float:
    """Mean NLL of the held-out set's assistant tokens (answer + end of turn), with transformers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    policy = AutoModelForCausalLM.from_pretrained(model, torch_dtype=torch.float32).eval()
    total, count = 0.0, 0
    for fruit in FRUITS:
        chat = _chat(fruit, HELD_OUT_SYSTEM)
        prompt = list(
            tokenizer.apply_chat_template(
                chat[:2], add_generation_prompt=True, tokenize=True, return_dict=True
            )["input_ids"]
        )
        full = list(tokenizer.apply_chat_template(chat, tokenize=True, return_dict=True)["input_ids"])
        assert full[: len(prompt)] == prompt
        ids = torch.tensor([full[: len(prompt) + 2]])  # the word and the end-of-turn token
        with torch.no_grad():
            log_probs = torch.log_softmax(policy(input_ids=ids).logits[0, :-1].float(), dim=-1)
        total -= log_probs[len(prompt) - 1 :].gather(-1, ids[0, len(prompt) :, None]).sum().item()
        count += 2
    return total / count


def test_rllm_sft_on_verl_without_a_sampler_trains_and_exports(tmp_path: Path) -> None:
    data, out = _write_chats(tmp_path / "chats.jsonl"), tmp_path / "run"
    held_out = _write_chats(tmp_path / "held_out.jsonl", HELD_OUT_SYSTEM)
    args = [
        *("sft", str(data), "--backend", "verl", "--out", str(out)),
        *("progress=false", "epochs=4", "batch_tokens=4096"),  # the whole set a step, 4 steps
        *(f"val_dataset={held_out}", "val_every=2"),
        *("warmup_steps=2", "lr_schedule=linear"),
        "backend.options.cluster.device=cpu",
        "backend.options.rollout.engine=none",
        "backend.options.gradient_checkpointing=false",
        f"backend.options.optim.lr={LR}",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "rllm.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    rows = read_metrics(out / "metrics.jsonl")
    train = [row for row in rows if row["step"] > 0]
    assert [row["step"] for row in train] == [1, 2, 3, 4]
    losses = [row["train/loss"] for row in train]
    assert losses[-1] < losses[0], losses  # the same answers, four updates: likelier each time
    # The LR each update stepped with, read back from verl's optimizer: warmup over two steps,
    # then linear towards 0 (rllm.engine.data.sft.lr_scale, as on the local backend).
    scales = [lr_scale(step, 4, 2, "linear") for step in range(4)]
    assert scales == [0.5, 1.0, 1.0, 0.5]
    assert [row["train/lr_scale"] for row in train] == scales
    assert [row["train/lr"] for row in train] == pytest.approx([LR * s for s in scales], rel=1e-6)
    # The held-out loss before training and every second step: reported, and falling.
    held = [(row["step"], row["val/loss"]) for row in rows if "val/loss" in row]
    assert [step for step, _ in held] == [0, 2, 4], rows
    assert held[0][1] > held[1][1] > held[2][1], held
    # ... and it is the held-out NLL of the assistant tokens: before training, the tiny model's own.
    assert held[0][1] == pytest.approx(_held_out_nll(out / "tiny-model"), rel=1e-4)
    # Only assistant tokens trained: each answer is one word (one token of the tiny tokenizer)
    # plus the template's end-of-turn token.
    assert all(row["train/trained_tokens"] == 2 * len(FRUITS) for row in train), rows
    checkpoint = out / "checkpoints" / "step_000004"
    assert (checkpoint / "backend" / "rllm_verl_state.json").is_file()

    exported = tmp_path / "exported"
    done = subprocess.run(
        [sys.executable, "-m", "rllm.cli.main", "export", str(out), "--to", str(exported)],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert _answer_nll(exported) < _answer_nll(out / "tiny-model") - 0.5
