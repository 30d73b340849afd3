"""Reading a spec file: bytes -> UTF-8 text -> YAML data, refusing what YAML would let through.

Anything else raises ``SpecError`` naming the file and the problem:

- the file must be UTF-8 text of at most ``MAX_SPEC_BYTES``;
- a key given twice in one mapping is refused (plain YAML keeps the last one silently);
- ``1e3`` is a number (YAML 1.1 reads it as a string);
- the data may hold at most ``MAX_SPEC_VALUES`` values, aliases expanded, nested at most
  ``MAX_SPEC_DEPTH`` levels.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from orchestrator.errors import SpecError, SpecProblem
from orchestrator.validation import short_repr

__all__ = ["MAX_SPEC_BYTES", "MAX_SPEC_DEPTH", "MAX_SPEC_VALUES", "read_spec_file", "yaml_data"]

MAX_SPEC_BYTES = 256 * 1024
"""The largest spec file read (the shipped specs are about 2 KB). It keeps ``validate`` quick on any
input: parsing 256 KB of YAML takes a fraction of a second."""

MAX_SPEC_VALUES = 5_000
"""The most values (scalars, lists and mappings, aliases expanded) a spec may hold. The shipped specs
hold about 100; this leaves room for a list at ``orchestrator.spec_search.MAX_CHOICES`` and more, stops an
alias bomb after this many steps, and bounds the work (and the problems) a generated file can cause."""

MAX_SPEC_DEPTH = 32
"""The deepest nesting a spec may have (a real one nests four levels)."""

class _Refused(yaml.YAMLError):
    """A construct this loader refuses; its message already names the line."""


_Base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser when built with it: faster


class _SpecLoader(_Base):  # type: ignore[misc, valid-type]
    """yaml's safe loader, but a key repeated in one mapping is an error and ``1e3`` is a float."""

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            first_line: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # "<<: *defaults" merges on purpose; keys given here override it
                key = self.construct_object(key_node, deep=True)
                try:
                    seen = key in first_line
                except TypeError:  # unhashable: the base class says so with its own message
                    continue
                line = key_node.start_mark.line + 1
                if seen:
                    raise _Refused(
                        f"duplicate key {short_repr(key)} on line {line} (first on line {first_line[key]}); "
                        "YAML would silently keep only the last one: merge them into one"
                    )
                first_line[key] = line
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: yaml.Node) -> int:
        try:
            return super().construct_yaml_int(node)
        except ValueError:  # Python refuses int("9" * 5000)
            line = node.start_mark.line + 1
            raise _Refused(f"the integer on line {line} has {len(node.value)} characters; too long") from None


_SpecLoader.add_constructor("tag:yaml.org,2002:int", _SpecLoader.construct_yaml_int)
_SpecLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def read_spec_file(path: str | Path) -> str:
    """The text of a spec file.

    Raises:
        SpecError: the file cannot be read, is larger than ``MAX_SPEC_BYTES``, or is not UTF-8
            text; the problem names the file.
    """
    source = str(path)
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_SPEC_BYTES + 1)
    except OSError as exc:
        raise _error(source, f"cannot read {source}: {exc.strerror or exc}") from None
    if len(raw) > MAX_SPEC_BYTES:
        raise _error(source, f"{source} is larger than {MAX_SPEC_BYTES:,} bytes; a spec is a small YAML text file")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _error(
            source,
            f"{source} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
            "a spec is a YAML text file",
        ) from None


def yaml_data(text: str, *, source: str = "<string>") -> dict[str, Any]:
    """The mapping a spec's YAML text holds.

    Raises:
        SpecError: not YAML, a duplicate key, not a mapping at the top, or too large or deep.
    """
    if len(text) > MAX_SPEC_BYTES:
        raise _error(source, f"the spec is longer than {MAX_SPEC_BYTES:,} characters; a spec is a small YAML file")
    try:
        data = yaml.load(text, Loader=_SpecLoader)  # noqa: S506 - a safe loader
    except yaml.YAMLError as exc:
        raise _error(source, f"not valid YAML: {exc}") from None
    except RecursionError:
        raise _error(source, f"not usable YAML: nested deeper than {MAX_SPEC_DEPTH} levels") from None
    if not isinstance(data, dict):
        raise _error(source, f"the top level must be a mapping of sections, got {type(data).__name__}")
    problem = _shape_problem(data)
    if problem:
        raise _error(source, problem)
    return data


def _shape_problem(data: object) -> str | None:
    """Whether ``data`` is too big or too deep, walking at most ``MAX_SPEC_VALUES`` steps."""
    stack: list[tuple[object, int]] = [(data, 1)]
    count = 0
    while stack:
        value, depth = stack.pop()
        count += 1
        if count > MAX_SPEC_VALUES:
            return (
                f"the spec holds more than {MAX_SPEC_VALUES:,} values (YAML aliases expanded); "
                "a spec is a small file: shorten its lists, or check for an alias that refers to itself"
            )
        if depth > MAX_SPEC_DEPTH:
            return (
                f"the spec nests deeper than {MAX_SPEC_DEPTH} levels (a spec nests about four); "
                "check for a YAML alias that refers to itself"
            )
        if isinstance(value, dict):
            stack.extend((item, depth + 1) for pair in value.items() for item in pair)
        elif isinstance(value, (list, tuple, set)):
            stack.extend((item, depth + 1) for item in value)
    return None


def _error(source: str, message: str) -> SpecError:
    return SpecError([SpecProblem("", message)], source=source)
