"""Property: any rows registered come back as the same Tasks (through parquet and the index)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rllm.cli.errors import CliError
from rllm.cli.registry import ColumnMap, DatasetRegistry

text = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)
answers = st.one_of(st.none(), st.integers(-(10**9), 10**9), text, st.lists(text, max_size=3))
rows = st.lists(
    st.fixed_dictionaries({"question": text, "answer": answers, "extra": text}), min_size=1, max_size=8
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=rows)
def test_registered_rows_come_back_as_tasks(
    tmp_path_factory: pytest.TempPathFactory, data: list[dict]
) -> None:
    import datasets

    registry = DatasetRegistry(tmp_path_factory.mktemp("home") / "datasets")
    # One type per column, as a real file has: mixed answer types are written as text.
    kinds = {type(r["answer"]) for r in data}
    if len(kinds) > 1:
        data = [{**r, "answer": str(r["answer"])} for r in data]
    registry.add("d", "memory", "train", ColumnMap(), datasets.Dataset.from_list(data))
    tasks = registry.load_tasks("d", "train")
    assert [t.id for t in tasks] == [str(i) for i in range(len(data))]
    assert [t.instruction for t in tasks] == [r["question"] for r in data]
    assert [t.ground_truth for t in tasks] == [r["answer"] for r in data]
    assert [t.metadata for t in tasks] == [{"extra": r["extra"]} for r in data]


def test_duplicate_ids_are_refused(tmp_path: Path) -> None:
    import datasets

    data = datasets.Dataset.from_list([{"question": "a", "k": "1"}, {"question": "b", "k": "1"}])
    with pytest.raises(CliError, match="duplicate ids"):
        DatasetRegistry(tmp_path).add("d", "f.jsonl", "train", ColumnMap(ground_truth=None, id="k"), data)


@pytest.mark.parametrize("name", ["", "a/b", ".hidden", " padded"])
def test_names_must_be_plain(tmp_path: Path, name: str) -> None:
    import datasets

    with pytest.raises(CliError, match="plain name"):
        DatasetRegistry(tmp_path).add(
            name, "f", "train", ColumnMap(), datasets.Dataset.from_list([{"question": "q"}])
        )
