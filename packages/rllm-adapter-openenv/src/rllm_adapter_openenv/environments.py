"""OpenEnv environments: the version check, what an ``openenv:NAME`` names, and where its server is.

NAME is one of

- ``example``: the adapter's guess-the-number environment (``examples.guess``);
- ``http://HOST:PORT`` (or ``https://``): an OpenEnv server already running, shared by the rollouts;
- ``pkg.module:attr``: an OpenEnv FastAPI app (openenv-core's ``create_app``) that the adapter
  serves itself on loopback, once per process (``serving``);
- an installed OpenEnv environment package's key (``echo`` for ``openenv-echo_env``), found with
  openenv-core's own discovery; its manifest's ``spec_version`` is checked and its
  ``server.app:app`` served on loopback.

An environment's action schema comes from the server's ``GET /schema``. With native tool calls
(``actions="tools"``) it is offered to the model as one OpenAI function tool, ``step``, whose
parameters are the action's JSON schema; a call's arguments are the action. In text mode an action
with one field takes the model's reply as that field's value, any other action takes the reply as
a JSON object.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import msgspec

from rllm.sdk import InfraError
from rllm.types.errors import InputError, LookupFailed, MissingExtraError

# The openenv-core API this adapter is written against: ``create_app`` (FastAPI app with ``/ws``
# sessions and ``/schema``), ``GenericEnvClient`` (reset/step over the session) and its
# ``_send``/``_receive`` pair, the ``WSErrorCode`` error codes, and ``EnvironmentDiscovery``.
SUPPORTED = ("0.3", "0.4")  # [first, next-unsupported)
# openenv.yaml ``spec_version``s this adapter understands.
SPEC_VERSIONS = (1,)
EXAMPLE_APP = "rllm_adapter_openenv.examples.guess:app"
SCHEMA_TIMEOUT_S = 30.0


class UnsupportedVersion(InputError):
    """The installed openenv-core, or an environment's manifest, is a version rLLM does not support."""


ACTION_TOOL = "step"  # the one tool a tool-calling model acts through


class EnvAddress(msgspec.Struct, frozen=True):
    """Where an environment runs: ``url`` (a running server) or ``app`` (served here), and how
    a reply becomes its action: ``action_field`` (one field) or None (a JSON object); the
    action's JSON schema (``metadata`` left out: the model never sets it) for the tool."""

    name: str
    url: str | None = None
    app: str | None = None
    action_field: str | None = None
    action_fields: tuple[str, ...] = ()
    action_schema: dict[str, Any] = msgspec.field(default_factory=dict)
    sandbox: bool = False  # the app is served inside each rollout's sandbox (its schema asked there)


def _key(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")[:3] if p.isdigit())


def check_version(installed: str) -> None:
    if not _key(SUPPORTED[0]) <= _key(installed) < _key(SUPPORTED[1]):
        raise UnsupportedVersion(
            f"openenv-core {installed} is not supported (rllm-adapter-openenv supports "
            f">={SUPPORTED[0]},<{SUPPORTED[1]})"
        )


def library() -> None:
    """Checks that openenv-core is installed, in the supported range."""
    try:
        installed = version("openenv-core")
    except PackageNotFoundError as exc:
        raise MissingExtraError(
            "openenv-core is not installed: pip install openenv-core (or rllm-adapter-openenv)"
        ) from exc
    check_version(installed)


def check_manifest(name: str, manifest: dict[str, Any] | None) -> None:
    """An environment package's openenv.yaml must declare a spec version this adapter speaks."""
    spec = (manifest or {}).get("spec_version")
    if spec is not None and spec not in SPEC_VERSIONS:
        raise UnsupportedVersion(
            f"OpenEnv environment {name!r} declares spec_version {spec!r}; rllm-adapter-openenv "
            f"supports {', '.join(map(str, SPEC_VERSIONS))}"
        )


def resolve(name: str, sandbox: bool = False) -> EnvAddress:
    """The address of environment ``name`` with its action schema (its server asked once).
    ``sandbox``: an app served inside each rollout's sandbox, never here: its schema is asked
    there, by the rollout (``rllm_adapter_openenv.sandboxed``)."""
    library()
    if sandbox:
        if name.startswith(("http://", "https://")):
            raise InputError(
                f"openenv:{name}: option sandbox serves the environment's app inside each rollout's "
                "sandbox; a running server (a URL) cannot be moved there: name its app (module:attr) "
                "or its installed package"
            )
        app = EXAMPLE_APP if name == "example" else name if ":" in name else _installed_app(name)
        return EnvAddress(name=name, app=app, sandbox=True)
    if name == "example":
        address = EnvAddress(name=name, app=EXAMPLE_APP)
    elif name.startswith(("http://", "https://")):
        address = EnvAddress(name=name, url=name.rstrip("/"))
    elif ":" in name:
        address = EnvAddress(name=name, app=name)
    else:
        address = EnvAddress(name=name, app=_installed_app(name))
    return with_schema(address, server_url(address))


def _installed_app(key: str) -> str:
    from openenv.auto._discovery import get_discovery

    environments = get_discovery().discover(use_cache=False)
    info = environments.get(key) or environments.get(key.removesuffix("_env"))
    if info is None:
        known = ", ".join(sorted(environments)) or "none installed"
        raise LookupFailed(
            f"no OpenEnv environment {key!r} (installed OpenEnv environments: {known}; or name "
            "'example', a server URL, or an app as module:attr)"
        )
    check_manifest(key, info.manifest)
    module = info.client_module_path.rsplit(".", 1)[0]
    return f"{module}.server.app:app"


def server_url(address: EnvAddress) -> str:
    """The URL to reach ``address``'s server: its own, or the loopback server of its app."""
    if address.url is not None:
        return address.url
    from rllm_adapter_openenv.serving import serve

    assert address.app is not None
    return serve(address.app)


def with_schema(address: EnvAddress, url: str) -> EnvAddress:
    """``address`` with its action fields, from the server's ``GET /schema``. A server that does
    not answer is an InfraError with the reason; one whose answer is not OpenEnv's is refused."""
    try:
        with urllib.request.urlopen(f"{url}/schema", timeout=SCHEMA_TIMEOUT_S) as response:
            schema = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise UnsupportedVersion(
            f"{url} answered GET /schema with HTTP {exc.code}: not an OpenEnv server of a supported API"
        ) from None
    except (OSError, ValueError) as exc:
        raise InfraError(f"the OpenEnv server at {url} is down: {type(exc).__name__}: {exc}") from None
    return schema_fields(address, schema, url)


def schema_fields(address: EnvAddress, schema: Any, url: str) -> EnvAddress:
    """``address`` with the action fields of ``schema`` (a server's ``GET /schema`` answer, at
    ``url``); one that is not OpenEnv's is refused."""
    action = schema.get("action") if isinstance(schema, dict) else None
    if not isinstance(action, dict) or not isinstance(action.get("properties", {}), dict):
        raise UnsupportedVersion(
            f"{url}/schema has no action schema: not an OpenEnv server of a supported API"
        )
    fields = tuple(sorted(k for k in action.get("properties", {}) if k != "metadata"))
    single = fields[0] if len(fields) == 1 else None
    return msgspec.structs.replace(
        address, action_field=single, action_fields=fields, action_schema=tool_parameters(action)
    )


def tool_parameters(action: dict[str, Any]) -> dict[str, Any]:
    """The action's JSON schema as a tool's parameters: without ``metadata`` (openenv-core's
    bookkeeping field on every action) and the pydantic class name."""
    properties = {k: v for k, v in action.get("properties", {}).items() if k != "metadata"}
    required = [k for k in action.get("required", ()) if k != "metadata"]
    schema = {k: v for k, v in action.items() if k not in ("properties", "required", "title")}
    return {**schema, "type": "object", "properties": properties, "required": required}


def action_tool(address: EnvAddress) -> dict[str, Any]:
    """The environment's action as an OpenAI function tool: calling it takes one step."""
    description = str(address.action_schema.get("description") or "").strip()
    return {
        "type": "function",
        "function": {
            "name": ACTION_TOOL,
            "description": (
                f"Take one step in the environment {address.name}: the arguments are the action"
                + (f" ({description})" if description else "")
                + "; the result is what the environment observes next."
            ),
            "parameters": address.action_schema or {"type": "object", "properties": {}},
        },
    }


def tool_action(arguments: dict[str, Any], address: EnvAddress) -> dict[str, Any]:
    """A tool call's arguments as the action. A field the action does not have is the model's
    mistake (InvalidAction); the types are the environment's to check (its pydantic model)."""
    unknown = sorted(set(arguments) - set(address.action_fields))
    if unknown:
        fields = ", ".join(address.action_fields) or "none"
        raise InvalidAction(f"invalid action: no field {', '.join(unknown)} (the action's fields: {fields})")
    return arguments


def to_action(reply: str, address: EnvAddress) -> dict[str, Any]:
    """The action a model's reply stands for: the reply itself as the one field's value, or the
    reply parsed as a JSON object. A reply that is neither raises InvalidAction (the model's)."""
    text = reply.strip()
    if address.action_field is not None:
        return {address.action_field: text}
    try:
        action = json.loads(text)
    except ValueError:
        action = None
    if not isinstance(action, dict):
        fields = ", ".join(address.action_fields) or "none"
        raise InvalidAction(f"reply with a JSON object of the action's fields ({fields})")
    return action


class InvalidAction(InputError):
    """The model's reply is not an action the environment takes (its message goes back to it)."""


def render(observation: Any) -> str:
    """An observation as the next user message: its one text field, else its fields as JSON."""
    if not isinstance(observation, dict):
        return str(observation)
    texts = [v for k, v in observation.items() if k != "metadata" and isinstance(v, str)]
    others = {k: v for k, v in observation.items() if k != "metadata" and not isinstance(v, str)}
    if len(texts) == 1 and not others:
        return texts[0]
    return json.dumps({k: v for k, v in observation.items() if k != "metadata"}, sort_keys=True, default=str)
