"""``serve_in``: the one register/unregister rule of the in-process server tables (the runtime's
upstreams by URL, the sdk's clients' server by event loop and origin)."""

from __future__ import annotations

import pytest

from rllm.types.errors import StateError
from rllm.types.in_process import serve_in


def test_a_key_is_served_once_and_a_stale_stop_leaves_its_successor() -> None:
    table: dict[str, object] = {}
    first, second = object(), object()
    stop_first = serve_in(table, "k", first, "http://h:1")
    with pytest.raises(StateError, match=r"http://h:1 is already served in process"):
        serve_in(table, "k", second, "http://h:1")
    assert table == {"k": first}
    stop_first()
    assert table == {}
    stop_second = serve_in(table, "k", second, "http://h:1")
    stop_first()  # a stop called late (its server already replaced) takes nothing out
    assert table == {"k": second}
    stop_second()
    stop_second()  # twice is harmless
    assert table == {}
