"""``TraceQuery``: the one description of a trace search, from the admin API down to the stores."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from rllm.types.errors import InputError


class TraceQuery(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Traces matching every filter given (``None``: any), ordered by creation time, at most
    ``limit`` of them. The same struct travels from ``GatewayAdmin.query_traces`` through the
    HTTP admin route (as query parameters) to ``TraceStore.query``."""

    session_id: str | None = None
    role: str | None = None
    since: float | None = None
    limit: int | None = None

    def to_params(self) -> dict[str, str]:
        """The filters given, as ``/admin/traces`` query parameters."""
        return {k: str(v) for k, v in msgspec.structs.asdict(self).items() if v is not None}

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> TraceQuery:
        """The query ``/admin/traces`` was asked (unknown parameters are the route's to refuse)."""
        try:
            since = float(params["since"]) if "since" in params else None
            limit = int(params["limit"]) if "limit" in params else None
        except ValueError:
            raise InputError("'since' must be a number and 'limit' an integer") from None
        return cls(session_id=params.get("session_id"), role=params.get("role"), since=since, limit=limit)


ALL_TRACES = TraceQuery()
