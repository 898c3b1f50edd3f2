"""rllm.gateway.tokenizer_load: the direct path loads exactly AutoTokenizer's tokenizer (same
class, vocabulary, special tokens, chat template, ids), in a process that never imports the auto
classes; anything the direct path does not know for sure goes through AutoTokenizer."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rllm.gateway.tokenizer_load import (
    AUTO_ONLY_ENV,
    DIRECT_MODEL_TYPES,
    direct_tokenizer_class,
    load_tokenizer,
)

pytest.importorskip("transformers")

WORDS = ["apple", "river", "stone"]
MESSAGES = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "say: apple river"},
    {"role": "assistant", "content": "apple river"},
    {"role": "user", "content": "again stone"},
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rllm.tiny.model import init_tiny_model

    return init_tiny_model(tmp_path_factory.mktemp("tiny"), WORDS, tool_calls=True)


@pytest.fixture(scope="module")
def tiny_vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rllm.tiny.vlm import init_tiny_vlm

    return init_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm"), WORDS)


def _same_tokenizer(a: Any, b: Any) -> None:
    assert type(a) is type(b)
    assert a.get_vocab() == b.get_vocab()
    assert a.chat_template == b.chat_template
    assert a.all_special_tokens == b.all_special_tokens
    assert (a.eos_token_id, a.pad_token_id, a.bos_token_id) == (
        b.eos_token_id,
        b.pad_token_id,
        b.bos_token_id,
    )
    assert a.init_kwargs == b.init_kwargs
    text = a.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert text == b.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert a.encode(text, add_special_tokens=True) == b.encode(text, add_special_tokens=True)
    ids = a.encode("apple stone river <|end|> unknownword", add_special_tokens=False)
    assert ids == b.encode("apple stone river <|end|> unknownword", add_special_tokens=False)
    assert a.decode(ids) == b.decode(ids)


@pytest.mark.parametrize("which", ["tiny", "tiny_vlm"])
def test_direct_path_loads_autotokenizers_tokenizer(which: str, request: pytest.FixtureRequest) -> None:
    from transformers import AutoTokenizer

    path = str(request.getfixturevalue(which))
    assert direct_tokenizer_class(path) == "TokenizersBackend"
    _same_tokenizer(load_tokenizer(path), AutoTokenizer.from_pretrained(path))


@pytest.mark.parametrize("model_type", sorted(DIRECT_MODEL_TYPES))
def test_every_listed_model_type_gets_the_same_class_from_autotokenizer(
    model_type: str, tiny: Path, tmp_path: Path
) -> None:
    """The list matches transformers' rule: for each type, AutoTokenizer itself picks the class."""
    from transformers import AutoTokenizer
    from transformers.models.auto.tokenization_auto import (
        MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS,
        TOKENIZER_MAPPING_NAMES,
    )

    assert model_type not in MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS
    assert TOKENIZER_MAPPING_NAMES.get(model_type) != "MistralCommonBackend"
    copy = tmp_path / model_type
    shutil.copytree(tiny, copy)
    (copy / "config.json").write_text(json.dumps({"model_type": model_type}))
    assert direct_tokenizer_class(str(copy)) == "TokenizersBackend"
    _same_tokenizer(load_tokenizer(str(copy)), AutoTokenizer.from_pretrained(str(copy)))


def _edit(path: Path, name: str, **changes: object) -> None:
    data = json.loads((path / name).read_text())
    data.update(changes)
    (path / name).write_text(json.dumps(data))


@pytest.mark.parametrize(
    "case",
    [
        "hub name",
        "other class",
        "remote code",
        "unlisted model type",
        "no config",
        "no tokenizer.json",
        "env",
    ],
)
def test_anything_else_goes_through_autotokenizer(
    case: str, tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = tmp_path / "m"
    shutil.copytree(tiny, copy)
    path = str(copy)
    if case == "hub name":
        path = "someone/some-model"
    elif case == "other class":
        _edit(copy, "tokenizer_config.json", tokenizer_class="Qwen2Tokenizer")
    elif case == "remote code":
        _edit(copy, "tokenizer_config.json", auto_map={"AutoTokenizer": [None, "tok.MyTokenizer"]})
    elif case == "unlisted model type":
        _edit(copy, "config.json", model_type="qwen2")  # AutoTokenizer overrides its hub class
    elif case == "no config":
        (copy / "config.json").unlink()
    elif case == "no tokenizer.json":
        (copy / "tokenizer.json").unlink()
    else:
        monkeypatch.setenv(AUTO_ONLY_ENV, "1")
    assert direct_tokenizer_class(path) is None


def test_unlisted_model_type_loads_what_autotokenizer_loads(tiny: Path, tmp_path: Path) -> None:
    """The fallback is AutoTokenizer itself: qwen2's registered class, not the hub's."""
    from transformers import AutoTokenizer

    copy = tmp_path / "qwen2"
    shutil.copytree(tiny, copy)
    _edit(copy, "config.json", model_type="qwen2")
    _same_tokenizer(load_tokenizer(str(copy)), AutoTokenizer.from_pretrained(str(copy)))


def test_direct_path_skips_transformers_auto_classes(tiny: Path) -> None:
    """What the direct path is for: a process that loads the tokenizer never imports
    transformers.models.auto (and with it torch._dynamo), unless the switch turns it off."""
    code = (
        "import sys; from rllm.gateway.tokenizer_load import load_tokenizer; "
        f"load_tokenizer({str(tiny)!r}); "
        "print(sorted(m for m in ('transformers.models.auto.tokenization_auto', 'torch._dynamo') if m in sys.modules))"
    )
    env = {k: v for k, v in os.environ.items() if k != AUTO_ONLY_ENV}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    env[AUTO_ONLY_ENV] = "1"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert "transformers.models.auto.tokenization_auto" in out.stdout
