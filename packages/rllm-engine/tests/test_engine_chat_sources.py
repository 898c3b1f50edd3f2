"""SFT conversations from Hugging Face datasets built here (no hub access): hf:NAME[:SPLIT] through
datasets.load_dataset (the hub path, on a local folder of data files) and save_to_disk folders."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest

from rllm.engine.data.chat_sources import ChatColumns, is_hf_source, read_chat_source, source_stem
from rllm.types import ConfigError
from rllm.types.errors import InputError

TOOL = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}


def chat(question: str, answer: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]


def write_parquet_folder(folder: Path, splits: dict[str, list[dict[str, object]]]) -> Path:
    """A dataset folder as a hub repo holds it: one parquet file per split."""
    folder.mkdir(parents=True)
    for split, rows in splits.items():
        datasets.Dataset.from_list(rows).to_parquet(str(folder / f"{split}.parquet"))
    return folder


def test_hf_name_and_split_load_through_load_dataset(tmp_path: Path) -> None:
    folder = write_parquet_folder(
        tmp_path / "chats",
        {
            "train": [
                {"messages": chat("1+1", "2"), "tools": json.dumps([TOOL])},
                {"messages": chat("2+2", "4"), "tools": ""},
            ],
            "test": [{"messages": chat("3+3", "6"), "tools": ""}],
        },
    )
    train = read_chat_source(f"hf:{folder}")
    assert [e.messages for e in train] == [chat("1+1", "2"), chat("2+2", "4")]
    assert train[0].tools == [TOOL] and train[1].tools is None  # a JSON string column, an empty one
    test = read_chat_source(f"hf:{folder}:test")
    assert [e.messages for e in test] == [chat("3+3", "6")]
    assert source_stem(f"hf:{folder}:test") == "chats-test" and source_stem("a/b.jsonl") == "b"


def test_save_to_disk_folders_sharegpt_and_prompt_response_columns(tmp_path: Path) -> None:
    sharegpt = [
        {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}], "key": "a"}
    ]
    saved = tmp_path / "saved"
    datasets.DatasetDict({"validation": datasets.Dataset.from_list(sharegpt)}).save_to_disk(str(saved))
    assert is_hf_source(str(saved)) and not is_hf_source(str(tmp_path / "x.jsonl"))
    columns = ChatColumns(messages="conversations", id="key", split="validation", system="be brief")
    [example] = read_chat_source(str(saved), columns)
    assert example.id == "a"
    assert example.messages == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
    ]
    single = tmp_path / "single"
    datasets.Dataset.from_list([{"question": "5-2", "answer": "3"}]).save_to_disk(str(single))
    [row] = read_chat_source(str(single), ChatColumns(prompt="question", response="answer"))
    assert row.messages == chat("5-2", "3")


def test_rows_that_map_to_no_conversation_are_refused_by_row(tmp_path: Path) -> None:
    folder = write_parquet_folder(tmp_path / "bad", {"train": [{"messages": chat("a", "b")}, {"text": "x"}]})
    with pytest.raises(InputError, match=r"row 1: no list in column 'messages' \(columns: messages\)"):
        read_chat_source(f"hf:{folder}")
    no_reply = write_parquet_folder(
        tmp_path / "noreply", {"train": [{"messages": [{"role": "user", "content": "q"}]}]}
    )
    with pytest.raises(InputError, match="no assistant message"):
        read_chat_source(f"hf:{no_reply}")
    speaker = tmp_path / "speaker"
    datasets.Dataset.from_list([{"messages": [{"from": "robot", "value": "x"}]}]).save_to_disk(str(speaker))
    with pytest.raises(InputError, match="'robot'"):
        read_chat_source(str(speaker))
    with pytest.raises(InputError, match="no split 'train'"):
        saved = tmp_path / "dict"
        datasets.DatasetDict(
            {"dev": datasets.Dataset.from_list([{"messages": chat("a", "b")}])}
        ).save_to_disk(str(saved))
        read_chat_source(str(saved))
    with pytest.raises(InputError, match="cannot load"):
        read_chat_source(f"hf:{folder}:nosuchsplit")
    with pytest.raises(ConfigError, match="prompt"):
        ChatColumns(prompt="question")
