"""Errors raised by rllm.types when data does not fit the schema."""

from __future__ import annotations


class SchemaError(ValueError):
    """A value does not fit the rLLM schema.

    ``path`` names the offending field from the root of the decoded object, e.g.
    ``trajectories[0].steps[3].logprobs``; the message repeats it so a log line is enough.
    """

    def __init__(self, message: str, path: str = "") -> None:
        self.path = path
        self.reason = message
        super().__init__(f"{message} (at `{path}`)" if path else message)


class InvariantError(SchemaError):
    """A Struct was built with values that contradict each other (raised from ``__post_init__``).

    ``field`` is the field the check blames; codecs join it to the Struct's position.
    """

    def __init__(self, message: str, field: str) -> None:
        self.field = field
        super().__init__(message, field)
