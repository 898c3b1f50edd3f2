"""BackendBase: what every training backend shares before and around ``start``.

A backend is built from its typed ``backend.options`` (a msgspec Struct) and keyword overrides;
the options are parsed and checked when it is built (``parse_options`` does it alone, starting
nothing, so a launcher can refuse a typo before it builds a model), and every call that needs
the running service says so the same way when ``start`` has not run.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any, ClassVar, Generic, TypeVar

from rllm.types.config_file import parse_options
from rllm.types.errors import ConfigError, MissingExtraError, StateError

OPTIONS_PREFIX = "backend.options"

C = TypeVar("C")
H = TypeVar("H")


class BackendBase(Generic[C]):
    """Subclasses set ``name`` and ``options_type`` (their options Struct) and keep their running
    state in attributes that ``require_started`` checks."""

    name: ClassVar[str]
    options_type: ClassVar[type[Any]]
    # Modules ``start`` imports that an extra installs, and the install that brings them: a
    # launcher calls ``check_installed`` before anything starts (not 30 s in, at the import).
    requires: ClassVar[tuple[str, ...]] = ()
    install: ClassVar[str] = ""
    # Whether its sampler scores given token ids (vLLM's ``prompt_logprobs``): the training-health
    # probe of ``weights_stale`` needs it; a backend without it has that check off, said once.
    scores_prompts: ClassVar[bool] = True
    # Why it cannot train several policies (a run's ``policies`` and ``roles``,
    # rllm.engine.training.policies); a backend that can overrides ``use_policies``.
    policies_refusal: ClassVar[str] = "it trains one policy"

    @classmethod
    def check_installed(cls) -> None:
        """MissingExtraError naming the install when a module of ``requires`` is missing."""
        missing = [module for module in cls.requires if importlib.util.find_spec(module) is None]
        if missing:
            raise MissingExtraError(
                f"backend {cls.name!r} needs {', '.join(missing)}, not installed: pip install '{cls.install}'"
            )

    def __init__(self, options: C | Mapping[str, Any] | None = None, **overrides: Any) -> None:
        self.config: C = self.parse_options(options, **overrides)

    @classmethod
    def parse_options(cls, options: C | Mapping[str, Any] | None = None, **overrides: Any) -> C:
        """The checked options, without building or starting anything; a ConfigError reading
        ``backend.options.KEY: MESSAGE`` otherwise."""
        return parse_options(options, cls.options_type, prefix=OPTIONS_PREFIX, overrides=overrides)

    def use_policies(self, policies: Mapping[str, Any]) -> None:
        """Take a run's policies (``policies.NAME`` sections) before ``start``; refused (a
        ConfigError with the reason) by a backend that trains one policy."""
        raise ConfigError.for_key(
            "policies", f"backend {self.name!r} cannot train several policies: {self.policies_refusal}"
        )

    def require_started(self, handle: H | None) -> H:
        """``handle`` (the running service, cluster, client...), or the error that names the fix."""
        if handle is None:
            raise StateError(f"{type(self).__name__} is not started: await backend.start() first")
        return handle
