"""The helpers a cookbook is built from: its shipped sample and its train_defaults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rllm.sdk.cookbook import sample_rows, train_defaults
from rllm.types.errors import InputError, RLLMError


def _ship(sample: Path, **splits: list[dict]) -> None:
    sample.mkdir(exist_ok=True)
    for split, rows in splits.items():
        # blank lines (an editor's trailing newline) are not rows
        (sample / f"{split}.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")


def test_rows_of_a_shipped_split(tmp_path: Path) -> None:
    _ship(tmp_path, train=[{"id": "a"}, {"id": "b"}], test=[{"id": "c"}])
    assert sample_rows(tmp_path, "train", cookbook="demo") == [{"id": "a"}, {"id": "b"}]
    assert sample_rows(tmp_path, "test", cookbook="demo") == [{"id": "c"}]


@pytest.mark.parametrize("split", ["validation", "../train", "hub:train", ""])
def test_any_other_split_is_refused_listing_the_known_ones(tmp_path: Path, split: str) -> None:
    _ship(tmp_path, test=[{"id": "c"}], train=[{"id": "a"}], extra=[])
    with pytest.raises(InputError) as info:
        sample_rows(tmp_path, split, cookbook="demo", other_splits=["hub:train"])
    assert (
        str(info.value)
        == f"the demo cookbook has splits 'train', 'test', 'extra', 'hub:train', not {split!r}"
    )
    assert isinstance(info.value, RLLMError)


def test_train_defaults_shape_and_overrides() -> None:
    assert train_defaults() == {
        "total_steps": 100,
        "tasks_per_step": 16,
        "group_size": 8,
        "val_split": "test",
        "val_every": 10,
        "rollout": {"sampling": {"temperature": 1.0, "max_tokens": 1024}},
    }
    merged = train_defaults(
        max_tokens=64, estimator="rloo", rollout={"sandbox_warm": 4}, algorithm={"gamma": 0.5}
    )
    assert merged["rollout"] == {"sampling": {"temperature": 1.0, "max_tokens": 64}, "sandbox_warm": 4}
    assert merged["algorithm"] == {"estimator": "rloo", "gamma": 0.5}


@given(
    st.dictionaries(
        st.sampled_from(["a", "b", "rollout"]),
        st.integers() | st.dictionaries(st.text(max_size=3), st.integers(), max_size=3),
        max_size=3,
    )
)
def test_extra_keys_win_and_keep_the_rest(extra: dict) -> None:
    merged = train_defaults(**extra)
    for key, value in extra.items():
        if isinstance(value, dict) and key == "rollout":
            assert (
                merged["rollout"]["sampling"] == {"temperature": 1.0, "max_tokens": 1024}
                or "sampling" in value
            )
            assert all(merged["rollout"][k] == v for k, v in value.items())
        else:
            assert merged[key] == value
    assert merged["val_split"] == "test"
