"""`rllm sft DATA --backend verl` on the CPU: no sampler (``rollout.engine = "none"``), one rank,
so verl's FSDP2 ``TrainingWorker`` runs in the CLI's process without Ray; rllm.algos'
``cross_entropy`` over the assistant tokens inside verl's engine, a verl checkpoint at the last
step that ``rllm export`` turns into a model whose answers are likelier than the untrained model's.

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

from rllm.engine.metrics_log import read_metrics

pytestmark = [pytest.mark.verl, pytest.mark.slow]

FRUITS = ["apple", "banana", "cherry", "grape"]
RUN_TIMEOUT_S = 900  # generous: the machine may be loaded; the run takes about a minute


def _write_chats(path: Path) -> Path:
    rows = [
        {
            "messages": [
                {"role": "system", "content": "repeat the word"},
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


def test_rllm_sft_on_verl_without_a_sampler_trains_and_exports(tmp_path: Path) -> None:
    data, out = _write_chats(tmp_path / "chats.jsonl"), tmp_path / "run"
    args = [
        *("sft", str(data), "--backend", "verl", "--out", str(out)),
        *("progress=false", "epochs=3", "batch_tokens=4096"),  # the whole set a step, 3 steps
        "backend.options.cluster.device=cpu",
        "backend.options.rollout.engine=none",
        "backend.options.gradient_checkpointing=false",
        "backend.options.optim.lr=0.01",
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
    assert [row["step"] for row in rows] == [1, 2, 3]
    losses = [row["train/loss"] for row in rows]
    assert losses[-1] < losses[0], losses  # the same answers, three updates: likelier each time
    # Only assistant tokens trained: each answer is one word (one token of the tiny tokenizer)
    # plus the template's end-of-turn token.
    assert all(row["train/trained_tokens"] == 2 * len(FRUITS) for row in rows), rows
    checkpoint = out / "checkpoints" / "step_000003"
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
