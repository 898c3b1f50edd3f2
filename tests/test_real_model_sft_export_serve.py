"""A real model through rLLM's supervised path and out again: `rllm sft` two steps (two epochs of one batch) on
SmolLM2-135M-Instruct's chat template (LoRA; the loss mask on the assistant's tokens only),
`rllm export` of the result (the adapter merged into the imported base), and `rllm serve` of the
exported folder, whose served logprobs of a fixed prompt are transformers' forward pass of the
same folder to 1e-4."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rllm.cli.main import main
from rllm.engine.chat_data import ChatExample, tokenize_chat
from rllm.engine.metrics_log import read_metrics

pytestmark = pytest.mark.real_model
CAPITALS = [("France", "Paris"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Japan", "Tokyo")]
SYSTEM = "Answer with one word."


def chats() -> list[dict[str, list[dict[str, str]]]]:
    return [
        {
            "messages": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"What is the capital of {country}?"},
                {"role": "assistant", "content": capital},
            ]
        }
        for country, capital in CAPITALS
    ]


def test_sft_masks_only_the_assistants_tokens_then_export_and_serve_match_transformers(
    smollm2: Path, tmp_path: Path
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    # The mask on SmolLM2's template: the reply and the <|im_end|>\n that ends the turn, nothing else.
    trained = 0
    for row, (_, capital) in zip(chats(), CAPITALS, strict=True):
        sequence = tokenize_chat(tokenizer, ChatExample(messages=row["messages"]))
        ids, mask = list(sequence.input_ids), list(sequence.loss_mask)
        masked = [t for t, m in zip(ids, mask, strict=True) if m]
        assert tokenizer.decode(masked, skip_special_tokens=False) == f"{capital}<|im_end|>\n"
        assert mask == sorted(mask)  # one span, at the end: system, user and header are context
        text = tokenizer.apply_chat_template(row["messages"], tokenize=False)
        assert ids == tokenizer.encode(text, add_special_tokens=False)
        trained += len(masked)
    data = tmp_path / "capitals.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in chats()))

    run = tmp_path / "sft"
    args = ["sft", str(data), "--model", str(smollm2), "--out", str(run), "progress=false", "total_steps=2"]
    args += [
        "epochs=2",
        "batch_tokens=400",
        "backend.options.lora.rank=8",
        "backend.options.learning_rate=1e-3",
    ]
    assert main(args) == 0
    rows = [r for r in read_metrics(run / "metrics.jsonl") if "train/loss" in r]
    assert [r["step"] for r in rows] == [1, 2]
    assert [r["train/trained_tokens"] for r in rows] == [trained, trained]  # the assistant tokens, every one

    exported = tmp_path / "exported"
    assert main(["export", str(run), "--to", str(exported)]) == 0
    assert (exported / "config.json").is_file() and (exported / "chat_template.jinja").is_file()
    served = _served_prompt_logprobs(exported, tokenizer)
    model = AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32).eval()
    ids = torch.tensor([_fixed_prompt(tokenizer)])
    with torch.no_grad():
        logits = model(ids).logits[0, :-1]
    forward = torch.log_softmax(logits, dim=-1)[torch.arange(ids.shape[1] - 1), ids[0, 1:]]
    torch.testing.assert_close(torch.tensor(served), forward, atol=1e-4, rtol=0)


def _fixed_prompt(tokenizer: object) -> list[int]:
    messages = [{"role": "user", "content": "What is the capital of Spain?"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)  # pyright: ignore[reportAttributeAccessIssue]
    return tokenizer.encode(text, add_special_tokens=False)  # pyright: ignore[reportAttributeAccessIssue]


def _served_prompt_logprobs(model: Path, tokenizer: object) -> list[float]:
    """`rllm serve MODEL --port 0` as a user runs it; the prompt tokens' own logprobs (vLLM's
    ``prompt_logprobs=0``) of the fixed prompt. Waits for the server's "serving ... at URL" line."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "rllm.cli.main", "serve", str(model), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("serving "), line
        url = line.split(" at ")[-1].strip()
        prompt = _fixed_prompt(tokenizer)
        body = {"model": "m", "prompt": prompt, "max_tokens": 1, "prompt_logprobs": 0, "temperature": 0}
        request = urllib.request.Request(
            f"{url}/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request) as response:
            answer = json.loads(response.read())
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=120)
    scores = answer["choices"][0]["prompt_logprobs"]
    assert scores[0] is None and len(scores) == len(prompt)
    return [entry[str(token)]["logprob"] for token, entry in zip(prompt[1:], scores[1:], strict=True)]
