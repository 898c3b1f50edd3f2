"""Config files: one reader for TOML, YAML and JSON, `a.b=value` overrides, typed conversion.

The format follows the file's suffix (``.toml``, ``.yaml``/``.yml``, ``.json``); anything else
is refused rather than guessed. Conversion to a msgspec Struct turns every validation error,
including the ones a Struct's ``__post_init__`` raises, into a :class:`ConfigError` whose
``key`` is the dotted key it blames (``rollout.sampling.top_p``, ``upstreams[0]``). ``parse_options`` reads a plugin's own option table (a backend's ``backend.options``) the same
way, its errors reading ``backend.options.KEY: MESSAGE``. Reading YAML
and parsing override values need PyYAML: the ``rllm-types[yaml]`` extra.
"""

from __future__ import annotations

import copy
import re
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from rllm.types.errors import ConfigError

T = TypeVar("T")

CONFIG_SUFFIXES: dict[str, str] = {".toml": "TOML", ".yaml": "YAML", ".yml": "YAML", ".json": "JSON"}

_UNKNOWN = re.compile(r"Object contains unknown field `(.+)`")
_MISSING = re.compile(r"Object missing required field `(.+)`")
# How a nested error names its own field: SchemaError's "(at `f`)" suffix, ConfigError's prefix.
_AT_SUFFIX = re.compile(r"(.*) \(at `([^`]+)`\)", re.S)
_KEY_PREFIX = re.compile(r"config key `([^`]+)`: (.*)", re.S)
_SEGMENT = re.compile(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]")


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The mapping a TOML, YAML or JSON file holds (format by suffix); ConfigError otherwise."""
    path = Path(path)
    fmt = CONFIG_SUFFIXES.get(path.suffix.lower())
    if fmt is None:
        accepted = ", ".join(CONFIG_SUFFIXES)
        raise ConfigError(f"config file {path}: unknown suffix {path.suffix!r}; accepted: {accepted}")
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    text = path.read_text(encoding="utf-8")
    try:
        if fmt == "TOML":
            doc = tomllib.loads(text)
        elif fmt == "JSON":
            doc = msgspec.json.decode(text)
        else:
            yaml = _yaml(f"config file {path}: reading YAML")
            try:
                doc = yaml.load(text, Loader=_yaml_loader())
            except yaml.YAMLError as exc:
                raise ConfigError(str(exc)) from None
    except (tomllib.TOMLDecodeError, msgspec.DecodeError, ValueError) as exc:
        raise ConfigError(f"config file {path} is not valid {fmt}: {exc}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return doc


def merge_config(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``extra`` over ``base``, table by table (a mapping in both is merged, anything else replaced)."""
    out = dict(base)
    for key, value in extra.items():
        both = isinstance(value, Mapping) and isinstance(out.get(key), Mapping)
        out[key] = merge_config(out[key], value) if both else value
    return out


def apply_overrides(doc: Mapping[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """A copy of ``doc`` with each ``key.sub=value`` set; the value is parsed as YAML
    (``3``, ``0.5``, ``true``, ``null``, ``[a, b]``), an empty one is the empty string."""
    out = copy.deepcopy(dict(doc))  # never edit the caller's defaults
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"override {item!r} is not of the form key.sub=value")
        value = _yaml("overrides").load(raw, Loader=_yaml_loader()) if raw.strip() else ""
        *parents, leaf = key.split(".")
        node = out
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {key!r}: `{part}` is a value, not a section", key)
            node = child
        node[leaf] = value
    return out


def convert_config(doc: Mapping[str, Any], type_: type[T], *, context: str = "") -> T:
    """``doc`` as a ``type_`` (a msgspec Struct); a ConfigError naming the dotted key otherwise.

    ``context`` (e.g. ``"gateway config gw.toml"``) starts the message when given.
    """
    try:
        return msgspec.convert(doc, type_)
    except msgspec.ValidationError as exc:
        key, message = _blame(doc, type_, str(exc))
    error = ConfigError.for_key(key, message) if key else ConfigError(message)
    raise ConfigError(f"{context}: {error}", key) if context else error from None


def parse_options(
    options: T | Mapping[str, Any] | None,
    type_: type[T],
    *,
    prefix: str,
    overrides: Mapping[str, Any] | None = None,
) -> T:
    """A plugin's typed options (e.g. a backend's ``backend.options``) from a ``type_`` instance, a
    mapping (TOML/YAML/CLI) or None, with ``overrides`` merged over them table by table.

    Every mistake is a ConfigError reading ``PREFIX.KEY: MESSAGE`` (``backend.options.learning_rat:
    unknown key``), its ``key`` the full dotted key; a ``__post_init__`` check blames its field by
    raising ``ConfigError.for_key(field, message)``.
    """
    if isinstance(options, type_) and not overrides:
        return options
    doc: dict[str, Any] = msgspec.to_builtins(options) if isinstance(options, type_) else dict(options or {})  # type: ignore[arg-type]
    if overrides:
        doc = merge_config(doc, overrides)
    try:
        return msgspec.convert(doc, type_)
    except msgspec.ValidationError as exc:
        key, message = _blame(doc, type_, str(exc))
    full = prefix if not key else f"{prefix}{key}" if key.startswith("[") else f"{prefix}.{key}"
    raise ConfigError(f"{full}: {message}", full) from None


def _blame(doc: Mapping[str, Any], type_: type, error: str) -> tuple[str, str]:
    """(dotted key, message) from msgspec's "MESSAGE - at `$.a[0].b`"."""
    message, sep, where = error.rpartition(" - at `")
    if not sep:
        message, where = error, "$`"
    segments = _resolve_dict_keys(doc, type_, error, _segments(where.rstrip("`").removeprefix("$")))
    inner = ""
    if found := _UNKNOWN.fullmatch(message):
        inner, message = found[1], "unknown key"
    elif found := _MISSING.fullmatch(message):
        inner, message = found[1], "required key is missing"
    elif found := _AT_SUFFIX.fullmatch(message):
        message, inner = found[1], found[2]
    elif found := _KEY_PREFIX.fullmatch(message):
        inner, message = found[1], found[2]
    key = _join(segments)
    if inner:
        key = f"{key}.{inner}" if key and not inner.startswith("[") else f"{key}{inner}"
    elif message.startswith("Invalid enum value") and (allowed := _allowed_values(type_, segments)):
        message += f"; allowed: {', '.join(repr(v) for v in allowed)}"
    return key, message


def _allowed_values(type_: type, segments: list[str | int]) -> list[Any] | None:
    """The values a Literal or Enum field at ``segments`` of ``type_`` takes (None: not one)."""
    import msgspec.inspect as mi

    def unwrap(node: Any) -> Any:  # `X | None`: X
        if isinstance(node, mi.UnionType):
            rest = [t for t in node.types if not isinstance(t, mi.NoneType)]
            return rest[0] if len(rest) == 1 else node
        return node

    node: Any = mi.type_info(type_)
    for segment in segments:
        node = unwrap(node)
        if isinstance(node, mi.StructType):
            node = next((f.type for f in node.fields if f.encode_name == segment), None)
        elif isinstance(node, mi.DictType):
            node = node.value_type
        elif isinstance(node, (mi.ListType, mi.SetType, mi.FrozenSetType, mi.VarTupleType)):
            node = node.item_type
        else:
            return None
    node = unwrap(node)
    if isinstance(node, mi.LiteralType):
        return list(node.values)
    if isinstance(node, mi.EnumType):
        return [member.value for member in node.cls]
    return None


def base_url_problem(url: str) -> str | None:
    """What is wrong with ``url`` as an OpenAI-compatible base URL (``http://HOST:PORT/v1``),
    naming the URL to pass instead, or None: a bare host, or an endpoint's own path
    (``.../v1/chat/completions``), gets a 404 for every call once the run has started."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return f"{url!r} is not an http(s) URL (e.g. http://127.0.0.1:8000/v1)"
    path = parts.path.rstrip("/")
    base = url.split("?")[0].rstrip("/")
    if not path:
        return f"{url} has no path: OpenAI-compatible servers answer under /v1: pass {base}/v1"
    for endpoint in ("/chat/completions", "/completions"):
        if path.endswith(endpoint):
            return f"{url} is an endpoint, not a base URL: pass {base.removesuffix(endpoint)}"
    return None


def _segments(path: str) -> list[str | int]:
    """``.a[0][...].b`` -> ["a", 0, "[...]", "b"]."""
    out: list[str | int] = []
    for name, index in _SEGMENT.findall(path):
        out.append(name if name else ("[...]" if index == "..." else int(index)))
    return out


def _resolve_dict_keys(
    doc: Mapping[str, Any], type_: type, error: str, segments: list[str | int]
) -> list[str | int]:
    """msgspec writes a mapping's key as ``[...]``: find it, as the one entry that alone gives the
    same error (entries before it are valid, or msgspec would have stopped there first)."""
    resolved: list[str | int] = []
    node: Any = doc
    for segment in segments:
        if segment == "[...]" and isinstance(node, Mapping):
            for key in node:
                trial = _with_only(doc, resolved, key)
                try:
                    msgspec.convert(trial, type_)
                except msgspec.ValidationError as exc:
                    if str(exc) == error:
                        segment = key
                        break
            else:
                return [*resolved, *segments[len(resolved) :]]
        try:
            node = node[segment]
        except (KeyError, IndexError, TypeError):
            return [*resolved, *segments[len(resolved) :]]
        resolved.append(segment)
    return resolved


def _with_only(doc: Any, path: list[str | int], key: Any) -> Any:
    """A copy of ``doc`` whose mapping at ``path`` holds only ``key`` (copies along the path only)."""
    if not path:
        return {key: doc[key]}
    head, *rest = path
    if isinstance(doc, list):
        items = list(doc)
        items[int(head)] = _with_only(doc[int(head)], rest, key)
        return items
    mapping = dict(doc)
    mapping[head] = _with_only(doc[head], rest, key)
    return mapping


def _join(segments: list[str | int]) -> str:
    out = ""
    for s in segments:
        if isinstance(s, str) and s == "[...]":
            out += s
        elif isinstance(s, int):
            out += f"[{s}]"
        else:
            out += f".{s}" if out else str(s)
    return out


def _yaml(what: str) -> Any:
    try:
        import yaml
    except ImportError:
        raise ConfigError(f"{what} needs PyYAML: pip install 'rllm-types[yaml]'") from None
    return yaml


# YAML 1.2's floats: PyYAML follows YAML 1.1, where `1e-3` (no dot) is a string, so
# `learning_rate=1e-3` would be refused as "expected float, got str".
_FLOAT_1_2 = re.compile(r"^[-+]?(?:\d[\d_]*(?:\.\d*)?|\.\d+)[eE][-+]?\d+$")
_LOADER: Any = None


def _yaml_loader() -> Any:
    """PyYAML's safe loader that also reads YAML 1.2 exponent floats (``1e-3``, ``5E+2``)."""
    global _LOADER
    if _LOADER is None:
        yaml = _yaml("YAML")

        class Loader(yaml.SafeLoader):
            pass

        Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_1_2, list("-+0123456789."))
        _LOADER = Loader
    return _LOADER
