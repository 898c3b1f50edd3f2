"""Where SFT conversations come from: a chat JSONL file, or a Hugging Face dataset.

    chats.jsonl                 OpenAI fine-tuning JSONL (rllm.engine.data.chat_data.read_chat_jsonl)
    hf:NAME[:SPLIT]             datasets.load_dataset(NAME, split=SPLIT or "train"): a hub name,
                                or a folder of data files (parquet, JSON lines, CSV)
    DIR (save_to_disk folder)   datasets.load_from_disk(DIR); a DatasetDict picks ``split``

Rows become :class:`~rllm.engine.data.chat_data.ChatExample` through :class:`ChatColumns`: a messages
column (OpenAI ``role``/``content`` dicts, or ShareGPT ``from``/``value`` with ``human``/``gpt``
roles), or a prompt and a response column for single-turn sets; an optional tools column (a
list, or the JSON string many hub sets store) and system prompt. A row that maps to no
trainable conversation is refused with its split and row number.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from rllm.engine.data.chat_data import ChatExample, check_example, read_chat_jsonl
from rllm.runtime.hub_names import check_hub_name
from rllm.types.errors import ConfigError, InputError, MissingExtraError

HF_PREFIX = "hf:"
# ShareGPT's speaker names -> OpenAI roles.
SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "system": "system",
    "tool": "tool",
    "function_response": "tool",
    "observation": "tool",
}


class ChatColumns(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How a dataset's columns map to a conversation (Hugging Face datasets; JSONL files are
    always OpenAI ``messages``)."""

    messages: str = "messages"  # a list of {role, content} (or ShareGPT {from, value}) dicts
    prompt: str = ""  # with ``response``: single-turn rows (user prompt -> assistant response)
    response: str = ""
    tools: str = "tools"  # optional column; a list or a JSON string
    system: str = ""  # a system prompt put first in every conversation without one
    id: str = ""  # a column whose value names each conversation (default: its row number)
    split: str = "train"  # for hf: without a split, and for a save_to_disk DatasetDict
    subset: str = ""  # the hub dataset's configuration name (e.g. gsm8k's "main")

    def __post_init__(self) -> None:
        if bool(self.prompt) != bool(self.response):
            raise ConfigError.for_key("columns", "set both `prompt` and `response` columns, or neither")


def is_hf_source(source: str) -> bool:
    """``hf:NAME`` or a ``save_to_disk`` folder (what :func:`read_chat_source` loads with datasets)."""
    return source.startswith(HF_PREFIX) or _is_saved_dataset(Path(source))


def read_chat_source(source: str, columns: ChatColumns | None = None) -> list[ChatExample]:
    """The conversations of ``source`` (a JSONL file, ``hf:NAME[:SPLIT]`` or a save_to_disk folder)."""
    columns = columns or ChatColumns()
    if not is_hf_source(source):
        return read_chat_jsonl(source)
    rows, where = _load_rows(source, columns)
    examples = [row_to_example(row, columns, f"{where} row {n}", n) for n, row in enumerate(rows)]
    if not examples:
        raise InputError(f"chat dataset {where} holds no row")
    return examples


def source_stem(source: str) -> str:
    """A short name for run folders: ``hf:org/set:test`` -> ``set-test``; ``a/b.jsonl`` -> ``b``."""
    if source.startswith(HF_PREFIX):
        name, _, split = source[len(HF_PREFIX) :].partition(":")
        stem = Path(name.rstrip("/")).name + (f"-{split}" if split else "")
        return "".join(c if c.isalnum() or c in "-_." else "-" for c in stem)
    return Path(source).stem


def row_to_example(row: dict[str, Any], columns: ChatColumns, where: str, number: int) -> ChatExample:
    """One dataset row as a checked conversation (InputError naming ``where`` otherwise)."""
    if columns.prompt:
        for key in (columns.prompt, columns.response):
            if not isinstance(row.get(key), str):
                raise InputError(f"{where}: column {key!r} must be text, got {type(row.get(key)).__name__}")
        messages = [
            {"role": "user", "content": row[columns.prompt]},
            {"role": "assistant", "content": row[columns.response]},
        ]
    else:
        raw = row.get(columns.messages)
        if not isinstance(raw, list):
            names = ", ".join(sorted(row)) or "none"
            raise InputError(
                f"{where}: no list in column {columns.messages!r} (columns: {names}); map yours with "
                "columns.messages=NAME, or columns.prompt=NAME columns.response=NAME"
            )
        messages = [_message(m, where, i) for i, m in enumerate(raw)]
    if columns.system and not (messages and messages[0]["role"] == "system"):
        messages.insert(0, {"role": "system", "content": columns.system})
    example = ChatExample(
        messages=messages,
        tools=_tools(row.get(columns.tools), where) if columns.tools else None,
        id=_row_id(row, columns, where, number),
    )
    check_example(example, where)
    return example


def _row_id(row: dict[str, Any], columns: ChatColumns, where: str, number: int) -> str:
    if not columns.id:
        return str(number)
    if row.get(columns.id) is None:
        raise InputError(f"{where}: no value in the id column {columns.id!r}")
    return str(row[columns.id])


def _message(raw: Any, where: str, index: int) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise InputError(f"{where}: message {index} is a {type(raw).__name__}, not an object")
    if "role" in raw:
        # datasets fills keys other rows have with None (a column's struct is the union of its rows')
        return {k: v for k, v in raw.items() if v is not None}
    if "from" in raw and "value" in raw:
        role = SHAREGPT_ROLES.get(str(raw["from"]).lower())
        if role is None:
            raise InputError(
                f"{where}: message {index} is from {raw['from']!r} (a ShareGPT speaker rLLM does not map)"
            )
        return {"role": role, "content": raw["value"]}
    raise InputError(f"{where}: message {index} has neither `role`/`content` nor ShareGPT `from`/`value`")


def _tools(raw: Any, where: str) -> list[dict[str, Any]] | None:
    if raw is None or raw == "" or raw == []:
        return None
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise InputError(f"{where}: the tools column is text but not JSON ({exc.msg})") from None
    if not isinstance(raw, list) or not all(isinstance(t, dict) for t in raw):
        raise InputError(f"{where}: the tools column must be a list of tool definitions")
    return raw


def _is_saved_dataset(path: Path) -> bool:
    # save_to_disk writes state.json (a Dataset) or dataset_dict.json (a DatasetDict).
    return path.is_dir() and ((path / "state.json").is_file() or (path / "dataset_dict.json").is_file())


def _load_rows(source: str, columns: ChatColumns) -> tuple[list[dict[str, Any]], str]:
    name, _, split = source[len(HF_PREFIX) :].partition(":")
    if source.startswith(HF_PREFIX):
        if not name:
            raise InputError(f"{source!r}: write hf:NAME or hf:NAME:SPLIT")
        # One line, not datasets' retries, when it cannot load; before datasets' seconds of import.
        check_hub_name(name, "dataset")
    try:
        import datasets
    except ImportError as exc:
        raise MissingExtraError(
            f"reading {source!r} needs `datasets`: pip install 'rllm-engine[hf]'"
        ) from exc
    if source.startswith(HF_PREFIX):
        split = split or columns.split
        try:
            data = datasets.load_dataset(name, columns.subset or None, split=split)
        except (FileNotFoundError, ValueError) as exc:  # unknown name, split or subset
            raise InputError(f"cannot load {source!r}: {exc}") from None
        return [dict(row) for row in data], f"{name}:{split}"  # pyright: ignore[reportCallIssue, reportArgumentType]
    saved = datasets.load_from_disk(source)
    if isinstance(saved, datasets.DatasetDict):
        if columns.split not in saved:
            raise InputError(
                f"{source}: no split {columns.split!r} (has {', '.join(map(str, saved))}); set columns.split"
            )
        saved = saved[columns.split]
    return [dict(row) for row in saved], source  # pyright: ignore[reportCallIssue, reportArgumentType]


__all__ = [
    "HF_PREFIX",
    "ChatColumns",
    "is_hf_source",
    "read_chat_source",
    "row_to_example",
    "source_stem",
]
