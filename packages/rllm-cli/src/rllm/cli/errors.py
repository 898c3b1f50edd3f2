"""How every `rllm` command fails: one line naming what is wrong, a hint, a meaningful exit code.

Exit codes: 0 success, 1 the work itself failed (a run crashed, a server died), 2 bad input
(usage, config key, file, column, unknown cookbook or backend), 3 a training run stopped by a
health check it names in ``health.stop_on`` (``rllm.engine.training.health``), 130 interrupted.
The traceback is printed only under ``rllm --debug``.
"""

from __future__ import annotations

from typing import IO, Any

import click
from rich.console import Console
from rich.markup import escape

from rllm.engine.plugins import PluginNotFoundError
from rllm.engine.training.health import HEALTH_STOP_EXIT, HealthStop
from rllm.types import ConfigError, RLLMError, SchemaError
from rllm.types.errors import MissingExtraError

BAD_INPUT = 2
FAILED = 1
HEALTH_STOPPED = HEALTH_STOP_EXIT  # 3
INTERRUPTED = 130

# Errors that mean "the input is wrong" rather than "the work broke" (a missing extra: the
# command asked for something this install cannot do).
INPUT_ERRORS: tuple[type[BaseException], ...] = (
    ConfigError,
    MissingExtraError,
    PluginNotFoundError,
    SchemaError,
    ValueError,
    FileNotFoundError,
    KeyError,
)

HINTS: dict[type[BaseException], str] = {
    ConfigError: "see the TrainerConfig keys in the rllm-engine README",
    PluginNotFoundError: "`rllm cookbook list` and `rllm backends` list what is installed",
    FileNotFoundError: "check the path",
}


class CliError(RLLMError, click.ClickException):
    """A one-line error with an optional hint, printed without a traceback."""

    def __init__(self, message: str, hint: str | None = None, exit_code: int = BAD_INPUT) -> None:
        super().__init__(message)
        self.hint = hint
        # click declares exit_code a class attribute but reads it from the instance: each CliError
        # carries its own (bad input, failure, interrupted).
        self.exit_code = exit_code  # pyright: ignore[reportAttributeAccessIssue]

    def show(self, file: IO[Any] | None = None) -> None:
        console = Console(stderr=file is None, file=file, highlight=False, soft_wrap=True)
        # Escaped: a message is text ("pip install 'pkg[extra]'"), never Rich markup.
        console.print(f"[red]error:[/red] {escape(self.format_message())}", markup=True)
        if self.hint:
            console.print(f"[dim]hint: {escape(self.hint)}[/dim]")


def as_cli_error(exc: BaseException) -> CliError:
    """Turn an exception from the work into the one-line error the user sees."""
    if isinstance(exc, HealthStop):  # its line already names the check, the evidence and the cause
        return CliError(str(exc), "`rllm doctor run RUN_DIR` shows every check over the run", HEALTH_STOPPED)
    hint = next((h for t, h in HINTS.items() if isinstance(exc, t)), None)
    if isinstance(exc, ConfigError) and not exc.key:
        hint = None  # about a file as a whole ("does not exist", "not valid TOML"): the keys do not help
    code = BAD_INPUT if isinstance(exc, INPUT_ERRORS) else FAILED
    message = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    if code == FAILED:
        message = f"{type(exc).__name__}: {message}"
        hint = hint or "run with `rllm --debug ...` for the traceback"
    return CliError(message or type(exc).__name__, hint, code)
