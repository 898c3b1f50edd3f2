"""The schema version carried by top-level records (Episode, TraceRecord, TrajectoryGroup)."""

from __future__ import annotations

from rllm.types.errors import InvariantError

# 2: one vocabulary from sampler to loss: Step.response_ids -> completion_ids, Step/TraceRecord
# .logprobs -> completion_logprobs, Trajectory/TrajectoryGroup.name -> role. Schema-1 records
# still decode (each Struct moves the old field to the new one), and schema_version is always
# written, so a schema-1 reader refuses a schema-2 record instead of dropping its tokens.
SCHEMA_VERSION = 2


def current_schema_version() -> int:
    """The default of every record's ``schema_version``: a factory, so msgspec always writes it."""
    return SCHEMA_VERSION


def check_schema_version(version: int) -> None:
    """Refuse records written by a newer, incompatible rllm-types."""
    if version > SCHEMA_VERSION:
        raise InvariantError(
            f"schema_version {version} is newer than this rllm-types supports ({SCHEMA_VERSION}); "
            "upgrade rllm-types",
            "schema_version",
        )
