"""TraceQuery: the same query on both sides of the /admin/traces route."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rllm.gateway.trace_query import TraceQuery
from rllm.types.errors import InputError

names = st.none() | st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-", min_size=1, max_size=12)


@given(
    session_id=names,
    role=names,
    since=st.none() | st.floats(allow_nan=False, allow_infinity=False, width=64),
    limit=st.none() | st.integers(min_value=0, max_value=10**6),
)
def test_a_query_survives_its_query_parameters(
    session_id: str | None, role: str | None, since: float | None, limit: int | None
) -> None:
    query = TraceQuery(session_id=session_id, role=role, since=since, limit=limit)
    assert TraceQuery.from_params(query.to_params()) == query


@pytest.mark.parametrize("params", [{"since": "yesterday"}, {"limit": "ten"}, {"limit": "1.5"}])
def test_bad_numbers_are_refused_naming_both_fields(params: dict[str, str]) -> None:
    with pytest.raises(InputError, match="'since' must be a number and 'limit' an integer"):
        TraceQuery.from_params(params)
