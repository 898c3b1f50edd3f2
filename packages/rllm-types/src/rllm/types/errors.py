"""The root of rLLM's exceptions, and the errors raised when data or a config does not fit."""

from __future__ import annotations


class RLLMError(Exception):
    """Every exception rLLM defines derives from this one, so ``except RLLMError`` catches them all.

    Each subclass also keeps the builtin base its meaning calls for (``ValueError`` for bad
    input, ``ConnectionError`` for a lost peer, ...), so ``except ValueError`` still works.
    """


class SchemaError(RLLMError, ValueError):
    """A value does not fit the rLLM schema.

    ``path`` names the offending field from the root of the decoded object, e.g.
    ``trajectories[0].steps[3].logprobs``; the message repeats it so a log line is enough.
    """

    def __init__(self, message: str, path: str = "") -> None:
        self.path = path
        self.reason = message
        super().__init__(f"{message} (at `{path}`)" if path else message)

    def __reduce__(self) -> tuple[type[SchemaError], tuple[str, str]]:
        # Rebuilt from (reason, path), which every subclass takes, so it crosses processes intact.
        return (type(self), (self.reason, self.path))


class InvariantError(SchemaError):
    """A Struct was built with values that contradict each other (raised from ``__post_init__``).

    ``field`` is the field the check blames; codecs join it to the Struct's position.
    """

    def __init__(self, message: str, field: str) -> None:
        self.field = field
        super().__init__(message, field)


class ConfigError(RLLMError, ValueError):
    """A config file, key, override or option is wrong; the message names it.

    ``key`` is the dotted key it blames (e.g. ``rollout.sampling.top_p``), "" when the error is
    about the file as a whole or about several keys together.
    """

    def __init__(self, message: str, key: str = "") -> None:
        self.key = key
        super().__init__(message)

    @classmethod
    def for_key(cls, key: str, message: str) -> ConfigError:
        """The error for one key, worded as every config error is: "config key `a.b`: ..."."""
        return cls(f"config key `{key}`: {message}", key)

    def __reduce__(self) -> tuple[type[ConfigError], tuple[str, str]]:
        # Crosses process boundaries intact (the default would rebuild it from the message alone).
        return (type(self), (str(self), self.key))


# The general-purpose classes product code raises where no more specific rLLM error fits. Each
# keeps the builtin base a caller may already catch, so switching a bare raise to one of these
# never changes which ``except`` clause sees it.


class InputError(RLLMError, ValueError):
    """A value handed to rLLM (an argument, a record, a reply) does not fit; the message names it."""


class UsageError(RLLMError, TypeError):
    """rLLM was handed the wrong kind of object (a class for an instance, a non-function to a decorator)."""


class StateError(RLLMError, RuntimeError):
    """An operation ran in a state that does not allow it (not started, already closed), or a step
    it relies on failed; the message says which."""


class NotFoundError(RLLMError, FileNotFoundError):
    """A file or directory rLLM needs is missing or is not what it should be (e.g. not a checkpoint)."""


class LookupFailed(RLLMError, KeyError):
    """A name or index was looked up and is not there; the message lists what is."""

    def __str__(self) -> str:
        # KeyError's str() is the repr of its argument (quotes around the message); say it plainly.
        return str(self.args[0]) if self.args else ""


class DeadlineError(RLLMError, TimeoutError):
    """Something rLLM waited for did not happen in time; the message names it and the limit."""


class MissingExtraError(RLLMError, ImportError):
    """An optional package is not installed; the message gives the ``pip install`` that adds it."""


class NothingToDo(RLLMError):
    """What was asked is already done (``--resume`` of a finished run): the message says so, and
    the command exits 0 without starting anything."""
