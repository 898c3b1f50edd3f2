"""rllm.types.config_file: TOML / YAML / JSON by suffix, overrides, errors naming the dotted key."""

from __future__ import annotations

import keyword
import pickle
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rllm.types import ConfigError, InvariantError
from rllm.types.config_file import (
    _FLOAT_1_2,
    apply_overrides,
    convert_config,
    merge_config,
    read_config_file,
)

# -------------------------------------------------------------------------------- file formats


def _toml_string(text: str) -> str:
    # Control characters, DEL, quote and backslash must be escaped in a TOML basic string.
    escaped = "".join(ch if ch >= " " and ch not in '"\\\x7f' else f"\\u{ord(ch):04x}" for ch in text)
    return f'"{escaped}"'


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{_toml_string(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"


class _Dumper(yaml.SafeDumper):
    """Quotes the strings the reader takes for YAML 1.2 floats (`1e5`), as a YAML 1.2 writer would."""


_Dumper.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_1_2, list("-+0123456789."))

WRITERS = {
    ".toml": lambda doc: "".join(f"{_toml_string(k)} = {_toml_value(v)}\n" for k, v in doc.items()),
    ".yaml": lambda doc: yaml.dump(doc, Dumper=_Dumper, allow_unicode=True),
    ".yml": lambda doc: yaml.dump(doc, Dumper=_Dumper),
    ".json": lambda doc: msgspec.json.encode(doc).decode(),
}

# Any text but YAML's non-ASCII line breaks, which PyYAML's emitter (the test's writer, not the
# reader under test) writes unescaped in plain keys when allow_unicode is on.
TEXT = st.characters(codec="utf-8", exclude_characters="\x85\u2028\u2029")
SCALARS = (
    st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(TEXT, max_size=12)
)
NESTED = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(TEXT, min_size=1, max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
DOCS = st.dictionaries(st.text(TEXT, min_size=1, max_size=8), NESTED, max_size=5)


@pytest.mark.parametrize("suffix", sorted(WRITERS))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=DOCS)
def test_any_nested_mapping_round_trips_through_each_format(tmp_path: Path, suffix: str, doc: dict) -> None:
    path = tmp_path / f"config{suffix}"
    path.write_text(WRITERS[suffix](doc), encoding="utf-8")
    assert read_config_file(path) == doc


def test_unknown_suffix_names_the_file_and_the_accepted_ones(tmp_path: Path) -> None:
    path = tmp_path / "run.conf"
    path.write_text("a = 1\n")
    with pytest.raises(ConfigError) as err:
        read_config_file(path)
    assert str(path) in str(err.value)
    for suffix in (".toml", ".yaml", ".yml", ".json"):
        assert suffix in str(err.value)


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("bad.toml", "a = \n", "not valid TOML"),
        ("bad.yaml", "a: [1, 2\n", "not valid YAML"),
        ("bad.json", '{"a": ', "not valid JSON"),
        ("list.yaml", "- 1\n- 2\n", "mapping at the top level"),
        ("empty.yaml", "", "mapping at the top level"),
    ],
)
def test_malformed_files_are_refused_naming_the_format(
    tmp_path: Path, name: str, text: str, message: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        read_config_file(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        read_config_file(tmp_path / "nope.toml")


# -------------------------------------------------------------------------------- overrides


def test_overrides_parse_values_as_yaml_and_leave_the_input_alone() -> None:
    base = {"a": {"b": 1}, "c": "x"}
    out = apply_overrides(base, ["a.b=2", "a.d.e=[1, two]", "f=null", "g=true", "h=", "c=0.5"])
    assert out == {"a": {"b": 2, "d": {"e": [1, "two"]}}, "c": 0.5, "f": None, "g": True, "h": ""}
    assert base == {"a": {"b": 1}, "c": "x"}


@settings(max_examples=100, deadline=None)
@given(x=st.floats(allow_nan=False, allow_infinity=False), style=st.sampled_from(["{:e}", "{:E}", "{:.0e}"]))
def test_exponent_floats_are_floats_as_in_yaml_1_2(x: float, style: str) -> None:
    """`learning_rate=1e-3` is a float (PyYAML alone, YAML 1.1, reads it as a string)."""
    text = style.format(x)
    assert apply_overrides({}, [f"lr={text}"]) == {"lr": float(text)}


def test_exponent_floats_in_a_yaml_file(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("lr: 1e-3\nwarm: 5E+2\nname: 1e5x\nquoted: '1e-3'\n", encoding="utf-8")
    assert read_config_file(path) == {"lr": 0.001, "warm": 500.0, "name": "1e5x", "quoted": "1e-3"}


def test_bad_overrides() -> None:
    with pytest.raises(ConfigError, match=r"key\.sub=value"):
        apply_overrides({}, ["nonsense"])
    with pytest.raises(ConfigError, match="`a` is a value") as err:
        apply_overrides({"a": 1}, ["a.b=2"])
    assert err.value.key == "a.b"


def test_merge_is_table_by_table() -> None:
    base = {"a": {"b": 1, "c": 2}, "d": [1]}
    assert merge_config(base, {"a": {"c": 3}, "d": [2]}) == {"a": {"b": 1, "c": 3}, "d": [2]}


# -------------------------------------------------------------------------------- errors name the key
# A random nested config schema (Structs, lists and mappings of Structs, int leaves that must be
# >= 0), a valid document for it, then one wrong value somewhere: the error names that key.

NAMES = st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True).filter(lambda s: not keyword.iskeyword(s))
Shape = dict[str, Any]  # field -> "int" | ("struct" | "list" | "dict", Shape)

SHAPES = st.recursive(
    st.dictionaries(NAMES, st.just("int"), min_size=1, max_size=3),
    lambda inner: st.dictionaries(
        NAMES,
        st.just("int") | st.tuples(st.sampled_from(["struct", "list", "dict"]), inner),
        min_size=1,
        max_size=3,
    ),
    max_leaves=8,
)


def _non_negative(self: Any) -> None:
    for name in self.__struct_fields__:
        value = getattr(self, name)
        if isinstance(value, int) and value < 0:
            raise InvariantError(f"{name} must be >= 0, got {value}", name)


def _struct(shape: Shape, counter: list[int]) -> type:
    fields: list[tuple[str, Any, Any]] = []
    for name, kind in shape.items():
        if kind == "int":
            fields.append((name, int, 0))
            continue
        container, sub = kind
        cls = _struct(sub, counter)
        typ = {"struct": cls, "list": list[cls], "dict": dict[str, cls]}[container]
        factory = {"struct": cls, "list": list, "dict": dict}[container]
        fields.append((name, typ, msgspec.field(default_factory=factory)))
    counter[0] += 1
    return msgspec.defstruct(
        f"Section{counter[0]}",
        fields,
        kw_only=True,
        forbid_unknown_fields=True,
        namespace={"__post_init__": _non_negative},
    )


@st.composite
def documents(draw: st.DrawFn, shape: Shape) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for name, kind in shape.items():
        if kind == "int":
            doc[name] = draw(st.integers(min_value=0, max_value=10))
            continue
        container, sub = kind
        if container == "struct":
            doc[name] = draw(documents(sub))
        elif container == "list":
            doc[name] = draw(st.lists(documents(sub), min_size=1, max_size=3))
        else:
            doc[name] = draw(st.dictionaries(NAMES, documents(sub), min_size=1, max_size=3))
    return doc


def _places(node: Any, key: str) -> list[tuple[str, Any, Any]]:
    """Every (dotted key, container, index) of a leaf or of a Struct-shaped mapping in the doc."""
    out: list[tuple[str, Any, Any]] = []
    items = enumerate(node) if isinstance(node, list) else node.items()
    for index, value in items:
        where = f"{key}[{index}]" if isinstance(node, list) else (f"{key}.{index}" if key else index)
        out.append((where, node, index))
        if isinstance(value, dict | list):
            out += _places(value, where)
    return out


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_a_wrong_value_anywhere_names_exactly_its_dotted_key(data: st.DataObject) -> None:
    shape = data.draw(SHAPES)
    schema = _struct(shape, [0])
    doc = data.draw(documents(shape))
    assert convert_config(doc, schema) is not None
    leaves = [p for p in _places(doc, "") if isinstance(p[1][p[2]], int)]
    key, container, index = data.draw(st.sampled_from(leaves))
    container[index] = data.draw(st.sampled_from(["oops", -1, 1.5, None]))  # wrong type, or < 0
    with pytest.raises(ConfigError) as err:
        convert_config(doc, schema)
    assert err.value.key == key, str(err.value)
    assert str(err.value).startswith(f"config key `{key}`: ")


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_an_unknown_key_anywhere_is_named(data: st.DataObject) -> None:
    shape = data.draw(SHAPES)
    schema = _struct(shape, [0])
    doc = data.draw(documents(shape))
    # Struct-shaped mappings: the top level, and every dict value not inside a mapping-of-Structs.
    sections = [("", doc)] + [
        (k, c[i]) for k, c, i in _places(doc, "") if isinstance(c[i], dict) and _is_struct_doc(shape, k)
    ]
    where, section = data.draw(st.sampled_from(sections))
    section["zz_not_a_field"] = 1
    with pytest.raises(ConfigError, match="unknown key") as err:
        convert_config(doc, schema)
    assert err.value.key == (f"{where}.zz_not_a_field" if where else "zz_not_a_field")


def _is_struct_doc(shape: Shape, key: str) -> bool:
    """Whether the doc value at ``key`` is a Struct (not a mapping of Structs)."""
    node: Any = ("struct", shape)
    for part in key.replace("[", ".[").split("."):
        if part.startswith("["):
            continue  # a list item of a list of Structs
        kind, sub = node
        if kind == "dict" and not isinstance(sub, str):
            node = ("struct", sub)  # a mapping key: its value is a Struct
            continue
        node = sub[part]
        if node == "int":
            return False
    kind, _ = node
    return kind == "struct" or (kind == "list" and key.endswith("]"))


def test_conversion_errors_with_a_context(tmp_path: Path) -> None:
    class Section(msgspec.Struct, forbid_unknown_fields=True):
        port: int = 0

    with pytest.raises(ConfigError, match=r"^gateway config gw\.toml: config key `port`: Expected `int`"):
        convert_config({"port": "x"}, Section, context="gateway config gw.toml")
    with pytest.raises(ConfigError, match="required key is missing") as err:
        convert_config({}, msgspec.defstruct("Needs", [("name", str)]))
    assert err.value.key == "name"


def test_config_error_pickles_with_its_key() -> None:
    error = ConfigError.for_key("rollout.concurrency", "concurrency must be >= 1")
    copy = pickle.loads(pickle.dumps(error))
    assert (str(copy), copy.key) == ("config key `rollout.concurrency`: concurrency must be >= 1", error.key)
