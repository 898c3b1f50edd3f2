"""`rllm doctor tokens`: the real gateway (cumulative mode) on real templates, scripted upstream.

The family tokenizers are tiny byte-level BPEs trained here carrying the published Qwen2.5
(hermes) and Llama-3.1 templates the gateway tests use (packages/rllm-gateway/tests/templates),
and a Qwen3-style template that strips thinking from earlier assistant turns.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rllm.cli.main import main
from rllm.gateway.harmony import SPECIAL_TOKENS

TEMPLATES = Path(__file__).parents[2] / "rllm-gateway" / "tests" / "templates"
FAMILIES: dict[str, dict[str, Any]] = {
    "qwen2_5": {
        "specials": ["<|im_start|>", "<|im_end|>", "<|endoftext|>"],
        "eos": "<|im_end|>",
        "bos": None,
    },
    "llama3_1": {
        "specials": [
            "<|begin_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
            "<|eom_id|>",
            "<|python_tag|>",
        ],
        "eos": "<|eot_id|>",
        "bos": "<|begin_of_text|>",
    },
    # gpt-oss's harmony special tokens; its template (templates/gpt_oss.jinja) renders harmony
    "gpt_oss": {
        "specials": [*SPECIAL_TOKENS, "<|endoftext|>"],
        "eos": "<|return|>",
        "bos": None,
    },
}
# Qwen3's behaviour in a few lines: an earlier assistant turn is rendered without its thinking.
THINK_STRIPPING = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' %}{{ m['content'].split('</think>')[-1].lstrip('\\n') }}"
    "{% else %}{{ m['content'] }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# A Qwen-style template that writes a newline before <|im_end|> on every assistant turn but the
# last: the sampled reply ends "...0<|im_end|>", its re-rendering "...0\n<|im_end|>".
NEWLINE_BEFORE_END = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "{% if m['role'] == 'assistant' and not loop.last %}{{ '\\n' }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build(path: Path, family: str, template: str | None = None) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    spec = FAMILIES[family]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=500, special_tokens=spec["specials"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(['{"name": "get_weather", "arguments": {"city": "Paris"}}'] * 50, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=spec["eos"], bos_token=spec["bos"])
    if family == "qwen2_5":
        fast.add_tokens(["<tool_call>", "</tool_call>"])
    fast.chat_template = template or (TEMPLATES / f"{family}.jinja").read_text()
    fast.save_pretrained(path)
    return str(path)


def doctor(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code = main(["doctor", "tokens", *args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def by_name(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in report["checks"]}


def test_tiny_passes_every_check_in_one_segment(capsys):
    code, report = doctor(capsys, "tiny")
    assert code == 0 and report["ok"] is True
    assert set(report) == {"model", "tool_format", "ok", "checks"}
    assert all(set(c) == {"name", "status", "detail", "first_diff"} for c in report["checks"])
    checks = by_name(report)
    assert checks["streaming = non-streaming"]["status"] == "pass"
    # The template writes '<|assistant|> the' where the sampled reply decodes to
    # '<|assistant|>the'; the ids are the same, and the gateway now extends on ids, not text.
    assert checks["multi-turn text"] == {
        "name": "multi-turn text",
        "status": "pass",
        "detail": "3 turns, one segment",
        "first_diff": None,
    }


@pytest.mark.parametrize(("family", "fmt"), [("qwen2_5", "hermes"), ("llama3_1", "llama3_json")])
def test_family_templates_pass_every_check(capsys, tmp_path, family, fmt):
    path = build(tmp_path / family, family)
    code, report = doctor(capsys, "my-model", "--tokenizer", path)
    assert report["tool_format"] == fmt
    checks = by_name(report)
    assert code == 0, report
    assert checks["multi-turn text"]["status"] == "pass"
    assert checks["streaming = non-streaming"]["status"] == "pass"
    assert checks["tool call: one"]["status"] == "pass"
    assert checks["tool call: malformed"]["status"] == "pass"
    assert checks["tool result (render -> parse -> render)"]["status"] == "pass"
    assert checks["tool call: parallel"]["status"] == ("pass" if family == "qwen2_5" else "skip")


def test_think_stripping_template_is_reported_precisely(capsys, tmp_path):
    path = build(tmp_path / "qwen3", "qwen2_5", THINK_STRIPPING)
    code, report = doctor(capsys, str(path))
    think = by_name(report)["multi-turn with thinking"]
    assert think["status"] == "warn"
    assert "because the chat template strips the thinking from earlier assistant turns" in think["detail"]
    assert "<think>" in think["detail"]
    assert think["first_diff"]["expected"]["text"] != think["first_diff"]["got"]["text"]
    assert by_name(report)["multi-turn text"]["status"] == "pass"
    assert code == 0


def test_a_newline_the_template_adds_before_end_of_turn_is_named_as_the_templates(capsys, tmp_path):
    # The sampler's tokens are the tokenizer's own; the template changes the text around them.
    path = build(tmp_path / "newline", "qwen2_5", NEWLINE_BEFORE_END)
    code, report = doctor(capsys, str(path))
    text = by_name(report)["multi-turn text"]
    assert text["status"] == "warn" and code == 0
    assert (
        "because the chat template adds whitespace ('\\n') before the end-of-turn token <|im_end|> "
        "of earlier assistant turns" in text["detail"]
    ), text["detail"]
    assert "non-canonical" not in text["detail"]
    assert (text["first_diff"]["expected"]["text"], text["first_diff"]["got"]["text"]) == ("<|im_end|>", "\n")
    # --strict: a warning fails the gate.
    assert main(["doctor", "tokens", str(path), "--strict", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["ok"] is True  # no check failed; the warning did


def test_strict_passes_a_model_without_warnings(capsys):
    assert main(["doctor", "tokens", "tiny", "--strict"]) == 0


def test_table_output_and_bad_input_exit_codes(capsys, tmp_path):
    assert main(["doctor", "tokens", "tiny"]) == 0
    out = capsys.readouterr().out
    assert "multi-turn text" in out and "pass" in out and "streaming" in out
    assert main(["doctor", "tokens", str(tmp_path / "missing")]) == 2
    assert "cannot load a tokenizer" in capsys.readouterr().err
    assert main(["doctor", "tokens", "tiny", "--upstream", "localhost:8000"]) == 2


def test_a_failing_check_exits_1(capsys, tmp_path):
    # Told the model writes hermes calls, the gateway (which reads Llama-3.1 JSON from this
    # template) parses none of them: every tool check fails and the doctor exits 1.
    path = build(tmp_path / "llama", "llama3_1")
    code, report = doctor(capsys, path, "--tool-format", "hermes")
    assert code == 1 and report["ok"] is False
    assert by_name(report)["tool call: one"]["status"] == "fail"
    assert by_name(report)["multi-turn text"]["status"] == "pass"


def test_a_real_upstream_whose_tokens_do_not_round_trip_is_reported(capsys, tmp_path):
    # MockUpstream tokenizes its reply character by character: ids the tokenizer would never
    # produce for that text, as a sampler may. The doctor names that, and skips the scripted checks.
    from transformers import AutoTokenizer

    from rllm.testing import MockUpstream
    from rllm.tiny import build_tokenizer

    build_tokenizer().save_pretrained(tmp_path / "tok")
    tok = AutoTokenizer.from_pretrained(tmp_path / "tok")
    mock = MockUpstream(tokenizer=tok, responder=lambda body: "the answer is 1").start_in_thread()
    try:
        code, report = doctor(capsys, "tiny", "--upstream", mock.url)
    finally:
        mock.stop_in_thread()
    checks = by_name(report)
    assert code == 0
    multi = checks["multi-turn text"]
    assert multi["status"] == "warn"
    assert "not the tokenizer's own tokenization" in multi["detail"]
    assert multi["first_diff"]["expected"]["text"] == "t" and multi["first_diff"]["got"]["text"] == "the"
    assert checks["streaming = non-streaming"]["status"] == "pass"
    assert checks["tool calls"] == {
        "name": "tool calls",
        "status": "skip",
        "detail": "scripted replies only: run without --upstream",
        "first_diff": None,
    }


def test_harmony_checks_calls_and_reports_gpt_oss_known_breaks(capsys, tmp_path):
    # A tiny tokenizer with gpt-oss's harmony special tokens and a template rendering harmony as
    # gpt-oss's does (templates/gpt_oss.jinja); nothing is downloaded.
    path = build(tmp_path / "gpt_oss", "gpt_oss")
    code, report = doctor(capsys, "gpt-oss-tiny", "--tokenizer", path)
    assert report["tool_format"] == "harmony"
    checks = by_name(report)
    assert code == 0 and report["ok"] is True, report
    assert checks["tool call: one"] == {
        "name": "tool call: one",
        "status": "pass",
        "detail": "1 call(s) parsed",
        "first_diff": None,
    }
    assert checks["tool call: parallel"]["status"] == "pass"
    malformed = checks["tool call: malformed"]
    assert malformed["status"] == "pass" and "unparsable harmony tool call arguments" in malformed["detail"]
    # The known breaks, each reported with its cause, cost and first differing token:
    text = checks["multi-turn text"]
    assert text["status"] == "warn"
    assert "ends an earlier final answer with <|end|> where the model sampled <|return|>" in text["detail"]
    assert "prompt tokens re-prefilled per turn (2 of 3 turns)" in text["detail"]
    assert (text["first_diff"]["expected"]["text"], text["first_diff"]["got"]["text"]) == (
        "<|return|>",
        "<|end|>",
    )
    analysis = checks["multi-turn with analysis"]
    assert analysis["status"] == "warn"
    assert "drops the analysis channel of earlier assistant turns" in analysis["detail"]
    assert analysis["first_diff"]["expected"]["text"] != analysis["first_diff"]["got"]["text"]
    result = checks["tool result (render -> parse -> render)"]
    assert result["status"] == "warn"
    assert "writes a tool call's recipient in the role header" in result["detail"]
    assert result["first_diff"]["expected"]["text"] == "<|channel|>"
    streaming = checks["streaming = non-streaming"]
    assert streaming["status"] == "pass", streaming  # a streamed reply is split into channels too


def test_images_round_trip_for_a_model_with_a_processor(capsys, tmp_path):
    # The tiny Qwen2-VL's tokenizer and image processor (no weights: the doctor needs none).
    from rllm.tiny.vlm import build_image_processor, build_vlm_tokenizer

    build_vlm_tokenizer().save_pretrained(tmp_path)
    build_image_processor().save_pretrained(tmp_path)
    code, report = doctor(capsys, "tiny-vlm", "--tokenizer", str(tmp_path))
    assert code == 0, report
    # 56x56, 112x56 and 84x84 images: 4, 8 and 9 placeholder tokens (28 px per merged patch),
    # every turn's prompt extending the last one's in one segment.
    assert by_name(report)["images (multi-turn)"] == {
        "name": "images (multi-turn)",
        "status": "pass",
        "detail": "3 turns with an image each, one segment; image tokens per turn [4, 12, 21]",
        "first_diff": None,
    }
    # A text-only model has no image check.
    code, report = doctor(capsys, "tiny")
    assert "images (multi-turn)" not in by_name(report)


def test_the_doctors_png_is_the_image_it_claims(tmp_path):
    from PIL import Image

    from rllm.cli.doctor_images import png_data_uri
    from rllm.types.images import parse_data_uri

    mime, data = parse_data_uri(png_data_uri(112, 56, 40))
    (tmp_path / "x.png").write_bytes(data)
    with Image.open(tmp_path / "x.png") as img:
        assert (mime, img.size, img.mode, img.getpixel((5, 5))) == (
            "image/png",
            (112, 56),
            "RGB",
            (40, 100, 200),
        )
