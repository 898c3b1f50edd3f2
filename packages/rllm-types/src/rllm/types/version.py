"""The schema version carried by top-level records (Episode, TraceRecord, TrajectoryGroup)."""

from __future__ import annotations

from rllm.types.errors import InvariantError

SCHEMA_VERSION = 1


def check_schema_version(version: int) -> None:
    """Refuse records written by a newer, incompatible rllm-types."""
    if version > SCHEMA_VERSION:
        raise InvariantError(
            f"schema_version {version} is newer than this rllm-types supports ({SCHEMA_VERSION}); "
            "upgrade rllm-types",
            "schema_version",
        )
