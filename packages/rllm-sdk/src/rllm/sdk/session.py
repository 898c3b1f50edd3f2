"""Session URL helpers: where an agent sends its LLM calls.

The engine gives every rollout a session URL ``http://GW/sessions/{sid}/v1``. Calls sent there
are recorded under the ``default`` role. A multi-role flow (solver + judge, planner + coder)
sends each role's calls to ``…/sessions/{sid}/roles/{role}/v1`` so the gateway records them as a
separately named trajectory; the engine then matches traces to trajectories by name, never by
position.
"""

from __future__ import annotations

import re
from typing import Any

from rllm.types import AgentConfig
from rllm.types.errors import InputError

_ROLE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_SESSION_URL = re.compile(r"^(?P<root>.*/sessions/[^/]+)(?:/roles/[^/]+)?/v1/?$")


def validate_role(role: str) -> str:
    """Return ``role`` if it can name a trajectory and a URL path segment, else raise ValueError."""
    if not isinstance(role, str) or not _ROLE_NAME.match(role):
        raise InputError(
            f"invalid role name {role!r}: use 1-64 characters from [A-Za-z0-9_.-], starting with a letter or digit"
        )
    return role


def role_url(config: AgentConfig | str, role: str) -> str:
    """The OpenAI-compatible base URL whose calls are recorded as trajectory ``role``.

    ``config`` is the flow's AgentConfig (or its ``base_url``). A URL that is not a gateway
    session URL (the flow runs directly against a model server, e.g. in a quick local test) is
    returned unchanged: there is no gateway to separate roles, and the flow should still run.
    """
    validate_role(role)
    base_url = config.base_url if isinstance(config, AgentConfig) else config
    if not isinstance(base_url, str) or not base_url:
        raise InputError(f"role_url needs a base URL, got {base_url!r}")
    match = _SESSION_URL.match(base_url)
    if match is None:
        return base_url
    return f"{match.group('root')}/roles/{role}/v1"


def session_id_from_url(base_url: str) -> str | None:
    """The session id inside a gateway session URL, or None for any other URL."""
    match = _SESSION_URL.match(base_url)
    if match is None:
        return None
    return match.group("root").rsplit("/", 1)[1]


def client_kwargs(config: AgentConfig, role: str | None = None) -> dict[str, Any]:
    """Keyword arguments for ``openai.OpenAI(...)`` / ``AsyncOpenAI(...)`` for this rollout.

    Keeps the SDK free of the openai dependency while saving every flow the same two lines.
    """
    base_url = config.base_url if role is None else role_url(config, role)
    return {"base_url": base_url, "api_key": config.api_key or "EMPTY"}


def sampling_kwargs(config: AgentConfig) -> dict[str, Any]:
    """The rollout's sampling parameters as chat.completions keyword arguments (unset ones omitted)."""
    s = config.sampling
    out: dict[str, Any] = {}
    for name in ("temperature", "top_p", "max_tokens", "stop", "seed"):
        value = getattr(s, name)
        if value is not None:
            out[name] = value
    return out
