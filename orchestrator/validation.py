"""How spectune's config models validate, and how their errors read.

:class:`StrictModel` (no type coercion, no NaN or infinity) and :func:`validation_problems`, which
turns pydantic's errors into one readable problem per field for every command.
"""

from __future__ import annotations

import difflib
import math
import re
import reprlib
import types
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from orchestrator.errors import SpecProblem

__all__ = ["RETIRED_FIELDS", "StrictModel", "short_repr", "validation_problems"]


class StrictModel(BaseModel):
    """Base of every config model a user writes: unknown keys refused, types strict (an integer
    still accepted for a float), no NaN or infinity, immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


_REPR = reprlib.Repr()
_REPR.maxstring = 80
_REPR.maxother = 80
_REPR.maxlong = 40
_REPR.maxlist = _REPR.maxdict = _REPR.maxtuple = _REPR.maxset = 6
_REPR.maxlevel = 3


def short_repr(value: object) -> str:
    """``repr(value)`` cut to a readable length, without walking all of a huge or cyclic value."""
    try:
        return _REPR.repr(value)
    except ValueError:  # an int beyond Python's 4300-digit str() limit, somewhere inside
        return f"<a {type(value).__name__} too large to show>"


_UNION_ARM = re.compile(r"^(none|bool|int|float|str|bytes|constrained-[a-z]+|[a-z][a-z-]*\[.*\])$")
"""How pydantic labels the arm of a union in an error's location (``str``, ``list[int]``,
``constrained-float``, ``literal['auto']``, ...)."""

_SUBFIELD = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*): (.*)$")
"""A validator's message line ``sub.field: message`` names a field below the one it validated."""

RETIRED_FIELDS: dict[str, str] = {
    "search.skip_predicted_chains": "the chain gate was removed in issue 57: with honest intervals (t quantiles, "
                                    "the start-to-start spread) it skipped no start in any replay "
                                    "(docs/search-efficiency.md); every proposed chain is measured",
}
"""Settings a spec once had, with why they went: an old spec gets this instead of "unknown key"."""

_NO_INPUT = ("missing", "value_error", "assertion_error", "extra_forbidden")
"""Error types whose message already says what is wrong without quoting the input."""

_TYPE_ERRORS: dict[str, str] = {
    "int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer",
    "float_type": "a number", "float_parsing": "a number",
    "bool_type": "true or false", "bool_parsing": "true or false",
    "string_type": "a string", "list_type": "a list", "dict_type": "a mapping",
    "model_type": "a mapping", "model_attributes_type": "a mapping",
}
"""Pydantic's wrong-type errors, with what they expected (refined by the field's own type when the
validated model is known)."""

_BOUND_ERRORS = ("greater_than", "greater_than_equal", "less_than", "less_than_equal")
"""Pydantic's out-of-bounds errors (their ``ctx`` holds the bound broken, the field the others)."""

MAX_KEYS_SHOWN = 8
"""Keys of a section named in "expected a mapping (keys: ...)" before the rest are elided."""


def validation_problems(exc: ValidationError, *, model: type[BaseModel] | None = None) -> list[SpecProblem]:
    """One readable problem per field and message, for any pydantic model's ``ValidationError``.

    - the field is the user's dotted path (pydantic's union-arm labels removed);
    - a wrong type, a missing field or a value out of bounds reads ``got VALUE (a TYPE); expected
      ALLOWED, e.g. EXAMPLE``: the field's type, bounds and allowed literals come from ``model``
      (pydantic's own context where the model is not known), the example is the value written as
      the type wants it (``'8'`` -> ``8``), else the field's default, else a bound;
    - a value no arm of a union accepts is one problem listing what each arm accepts;
    - an unknown key lists the keys allowed there, with a "did you mean" when one is close
      (``model`` is the validated model, whose fields are the allowed keys);
    - any other pydantic message quotes the offending value (cut short) unless it already says it;
    - a validator's multi-line message becomes one problem per line, and a line that starts with
      ``sub.field: `` is filed under that sub-field.

    Args:
        exc: What ``model_validate`` raised.
        model: The model that was validated, for the allowed keys of an unknown-key problem and the
            type, bounds and default of a field.
    """
    problems: list[SpecProblem] = []
    seen: set[tuple[str, str]] = set()

    def add(field: str, message: str) -> None:
        for line in message.split("\n"):
            where = field
            match = _SUBFIELD.match(line)
            if match:
                where = ".".join(p for p in (field, match.group(1)) if p)
                line = match.group(2)
            if (where, line) not in seen:
                seen.add((where, line))
                problems.append(SpecProblem(where, line))

    unions: dict[str, tuple[dict[str, list[Any]], Any]] = {}  # field -> ({arm: its errors}, value), first-seen order
    for error in exc.errors():
        loc = [str(part) for part in error["loc"]]
        arm = next((i for i, part in enumerate(loc) if _UNION_ARM.match(part)), None)
        if arm is not None:
            field = ".".join(loc[:arm])
            arms, value = unions.setdefault(field, ({}, error.get("input")))
            arms.setdefault(loc[arm], []).append(error)
            if len(loc) == arm + 1:  # the value the union was given, not an item inside one arm
                unions[field] = (arms, error.get("input"))
            continue
        if loc and loc[-1] == "[key]":  # pydantic's marker for a mapping key that failed
            add(".".join(loc[:-1]), f"keys must be strings, got {short_repr(error.get('input'))}")
            continue
        field = ".".join(loc)
        message = str(error["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
        target = _target(model, loc) if model is not None else None
        if error["type"] == "extra_forbidden" and field in RETIRED_FIELDS:
            message = f"no longer a setting: {RETIRED_FIELDS[field]}; delete the line"
        elif error["type"] == "extra_forbidden":
            key = loc[-1] if loc else ""
            allowed = _allowed_keys(model, loc[:-1]) if model is not None else []
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            message = f"unknown key{hint}; allowed here: {', '.join(allowed)}" if allowed else f"unknown key{hint}"
        elif error["type"] == "missing":
            message = _missing(target)
        elif error["type"] in _TYPE_ERRORS or error["type"] == "literal_error":
            message = _wrong_value(error, target)
        elif error["type"] in _BOUND_ERRORS:
            message = _out_of_bounds(error, target)
        elif "input" in error and error["type"] not in _NO_INPUT:
            message = f"{message} (got {short_repr(error['input'])})"
        add(field, message)
    for field, (arms, value) in unions.items():
        target = _target(model, field.split(".") if field else []) if model is not None else None
        add(field, _no_arm(arms, value, target))
    return problems


def _allowed_keys(model: type[BaseModel], path: list[str]) -> list[str]:
    """Field names of the model found at ``path`` inside ``model`` (for "did you mean")."""
    target = _target(model, path)
    return list(target.kind.model_fields) if target is not None and _is_model(target.kind) else []


# --- what a field allows ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Target:
    """What the spec allows at one path: the type (optional and annotated wrappers removed), its
    constraints, whether null is allowed, the default (``PydanticUndefined`` if none) and the
    field's description."""

    kind: Any
    metadata: tuple[Any, ...] = ()
    nullable: bool = False
    default: Any = PydanticUndefined
    description: str | None = None


def _unwrapped(annotation: Any) -> tuple[Any, list[Any], bool]:
    """``annotation`` without ``Annotated`` and ``Optional``: (the type, its constraints, nullable).
    A union of several non-null types is returned as it is."""
    metadata: list[Any] = []
    nullable = False
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            base, *extra = get_args(annotation)
            for item in extra:
                metadata.extend(item.metadata if isinstance(item, FieldInfo) else [item])
            annotation = base
            continue
        if origin in (Union, types.UnionType):
            arms = [a for a in get_args(annotation) if a is not type(None)]
            nullable = nullable or len(arms) < len(get_args(annotation))
            if len(arms) == 1:
                annotation = arms[0]
                continue
        return annotation, metadata, nullable


def _is_model(kind: Any) -> bool:
    return isinstance(kind, type) and issubclass(kind, BaseModel)


def _target(model: type[BaseModel], loc: list[str]) -> _Target | None:
    """What ``model`` allows at the error location ``loc`` (through sections, list items and
    mapping values), or None where its type cannot be followed."""
    target = _Target(kind=model)
    for part in loc:
        kind, _, _ = _unwrapped(target.kind)
        if _is_model(kind):
            info = kind.model_fields.get(part)
            if info is None:
                return None
            default = info.default
            if default is PydanticUndefined and info.default_factory is not None \
                    and not info.default_factory_takes_validated_data:
                default = info.default_factory()  # type: ignore[call-arg]
            target = _Target(kind=info.annotation, metadata=tuple(info.metadata), default=default,
                             description=info.description)
        elif get_origin(kind) is dict and len(get_args(kind)) == 2:
            target = _Target(kind=get_args(kind)[1])
        elif get_origin(kind) in (list, tuple) and part.isdigit() and get_args(kind):
            target = _Target(kind=get_args(kind)[0])
        else:
            return None
    kind, metadata, nullable = _unwrapped(target.kind)
    return _Target(kind=kind, metadata=(*target.metadata, *metadata), nullable=nullable, default=target.default,
                   description=target.description)


def _bounds(target: _Target | None, ctx: dict[str, Any] | None) -> dict[str, Any]:
    """The field's ``gt``/``ge``/``lt``/``le`` constraints, with the one pydantic reported."""
    found = {name: getattr(item, name) for item in (target.metadata if target else ())
             for name in ("gt", "ge", "lt", "le") if getattr(item, name, None) is not None}
    found.update({name: value for name, value in (ctx or {}).items() if name in ("gt", "ge", "lt", "le")})
    return found


def _number(value: Any) -> str:
    """A bound as a user writes it: ``2592000``, not ``2592000.0``."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value)


def _range(bounds: dict[str, Any]) -> str:
    """``' in [1, 64]'``, ``' in (0, 0.5)'``, ``' >= 0'``, ``''``."""
    low = ("[", bounds["ge"]) if "ge" in bounds else ("(", bounds["gt"]) if "gt" in bounds else None
    high = ("]", bounds["le"]) if "le" in bounds else (")", bounds["lt"]) if "lt" in bounds else None
    if low and high:
        return f" in {low[0]}{_number(low[1])}, {_number(high[1])}{high[0]}"
    if low:
        return f" {'>=' if low[0] == '[' else '>'} {_number(low[1])}"
    if high:
        return f" {'<=' if high[0] == ']' else '<'} {_number(high[1])}"
    return ""


def _within(value: Any, bounds: dict[str, Any]) -> bool:
    return (("ge" not in bounds or value >= bounds["ge"]) and ("gt" not in bounds or value > bounds["gt"])
            and ("le" not in bounds or value <= bounds["le"]) and ("lt" not in bounds or value < bounds["lt"]))


def _shown(value: Any) -> str:
    """A value as YAML writes it (``true``, ``null``), others as ``short_repr``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return short_repr(value)


def _kind_of(value: Any) -> str:
    """What a value is, in YAML's words: ``a string``, ``an integer``, ``a mapping``."""
    for kind, words in ((bool, "a boolean"), (int, "an integer"), (float, "a number"), (str, "a string"),
                        ((list, tuple), "a list"), (dict, "a mapping")):
        if isinstance(value, kind):
            return words
    return "null" if value is None else f"a {type(value).__name__}"


def _literals(target: _Target | None, ctx: dict[str, Any] | None) -> list[str]:
    """The values a ``Literal`` field allows, shown (from the model, else pydantic's ``expected``)."""
    if target is not None and get_origin(target.kind) is Literal:
        return [_shown(v) for v in get_args(target.kind)]
    expected = str((ctx or {}).get("expected", ""))
    return re.findall(r"'[^']*'|[^\s,']+(?=,| or |$)", expected) if expected else []


def _one_of(values: list[str]) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    return values[0] if len(values) == 1 else f"{', '.join(values[:-1])} or {values[-1]}"


def _choices(values: list[str]) -> str:
    """A few values as ``a, b or c``; more as ``one of a, b, c, d``."""
    return _one_of(values) if len(values) <= 3 else f"one of {', '.join(values)}"


def _allowed(target: _Target | None, *, bounds: dict[str, Any], fallback: str) -> tuple[str, Any]:
    """What the field allows, in words (``an integer in [1, 64]``), and its kind (``int``, ...)
    for the example; ``fallback`` (pydantic's expectation) where the type cannot be followed."""
    kind = target.kind if target is not None else None
    if get_origin(kind) is Literal:
        return _choices(_literals(target, None)), Literal
    if kind is bool:
        return "true or false", bool
    if kind is int:
        return f"an integer{_range(bounds)}", int
    if kind is float:
        return f"a number{_range(bounds)}", float
    if kind is str:
        return "a string", str
    if get_origin(kind) in (list, tuple) or kind in (list, tuple):
        items, _, _ = _unwrapped(get_args(kind)[0]) if get_args(kind) else (Any, [], False)
        words = {int: "integers", float: "numbers", str: "strings", bool: "true/false values"}.get(items)
        if get_origin(items) is Literal:
            words = _one_of([_shown(v) for v in get_args(items)])
        return f"a list of {words}" if words else "a list", list
    if get_origin(kind) is dict or kind is dict:
        return "a mapping", dict
    if _is_model(kind):
        keys = list(kind.model_fields)
        shown = ", ".join(keys[:MAX_KEYS_SHOWN]) + (", ..." if len(keys) > MAX_KEYS_SHOWN else "")
        return f"a mapping (keys: {shown})", dict
    range_words = {"an integer": int, "a number": float}
    return fallback + (_range(bounds) if fallback in range_words else ""), range_words.get(fallback)


def _written_as(value: Any, kind: Any) -> Any:
    """``value`` as the type wants it, when it is plainly that (``'8'`` or ``8.0`` for an integer,
    ``'yes'`` for true, ``5`` for a list: ``[5]``), else None."""
    if kind is int:
        if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
            return int(value)
        if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d{1,15}\s*", value):
            return int(value)
    if kind is float and isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return None
        return number if math.isfinite(number) else None
    if kind is bool and isinstance(value, (str, int)) and not isinstance(value, bool):
        return {"true": True, "yes": True, "on": True, "1": True,
                "false": False, "no": False, "off": False, "0": False}.get(str(value).strip().lower())
    if kind is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if kind is list and isinstance(value, (int, float, str)) and not isinstance(value, bool):
        return [value]
    return None


def _example(value: Any, target: _Target | None, kind: Any, bounds: dict[str, Any]) -> str:
    """``, e.g. EXAMPLE``: the value written as the type wants it, else the field's default, else a bound."""
    scalar = {int: lambda v: isinstance(v, int) and not isinstance(v, bool),
              float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
              bool: lambda v: isinstance(v, bool), str: lambda v: isinstance(v, str) and v.strip() != ""}
    if kind is list:  # a list whose every item is of the list's own item type
        items = _unwrapped(get_args(target.kind)[0])[0] if target is not None and get_args(target.kind) else None
        item_fits = scalar.get(items) or (
            (lambda v: v in get_args(items)) if get_origin(items) is Literal else None)
        fits = None if item_fits is None else (lambda v: isinstance(v, list) and v != [] and all(map(item_fits, v)))
    else:
        fits = scalar.get(kind)
    if fits is None:
        return ""
    numeric = kind in (int, float)
    candidates = [_written_as(value, kind)]
    if target is not None:
        candidates.append(target.default)
    if numeric:
        candidates.append(bounds.get("ge"))  # the least value allowed (an upper bound is rarely what anyone means)
    for candidate in candidates:
        same = type(candidate) is type(value) and candidate == value
        if candidate is not None and not same and fits(candidate) and (not numeric or _within(candidate, bounds)):
            shown = _number(candidate) if numeric else repr(candidate) if kind is str else _shown(candidate)
            return f", e.g. {shown}"
    return ""


def _first_sentence(text: str | None) -> str:
    """A field's description up to its first full stop or semicolon, cut to a readable length."""
    if not text:
        return ""
    sentence = re.split(r"(?<=[.;])\s", text.strip(), maxsplit=1)[0].rstrip(".;")
    return sentence if len(sentence) <= 120 else sentence[:117] + "..."


def _missing(target: _Target | None) -> str:
    """``missing (required); expected ALLOWED`` and what the field is for."""
    if target is None:
        return "missing (required)"
    allowed, _ = _allowed(target, bounds=_bounds(target, None), fallback="")
    about = _first_sentence(target.description)
    return "missing (required)" + (f": {about}" if about else "") + (f"; expected {allowed}" if allowed else "")


def _wrong_value(error: Any, target: _Target | None) -> str:
    """``got VALUE (a TYPE); expected ALLOWED, e.g. EXAMPLE`` for a wrong type or an unknown literal."""
    value = error.get("input")
    bounds = _bounds(target, None)
    got = f"got {_shown(value)}" + ("" if value is None else f" ({_kind_of(value)})")
    if error["type"] == "literal_error":
        literals = _literals(target, error.get("ctx"))
        plain = [v.strip("'") for v in literals]
        close = [v for v in plain if isinstance(value, str) and v.lower() == value.strip().lower()] or (
            difflib.get_close_matches(value, plain, n=1) if isinstance(value, str) else [])
        nulls = ["null"] if target is not None and target.nullable else []
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"{got}; expected {_choices([*literals, *nulls])}{hint}"
    allowed, kind = _allowed(target, bounds=bounds, fallback=_TYPE_ERRORS[error["type"]])
    nulls = " or null" if target is not None and target.nullable else ""
    return f"{got}; expected {allowed}{nulls}{_example(value, target, kind, bounds)}"


def _out_of_bounds(error: Any, target: _Target | None) -> str:
    """``got VALUE; expected a number in (0, 0.5], e.g. EXAMPLE``: every bound of the field, not
    only the one broken."""
    value = error.get("input")
    bounds = _bounds(target, error.get("ctx"))
    fallback = "an integer" if isinstance(value, int) and not isinstance(value, bool) else "a number"
    allowed, kind = _allowed(target, bounds=bounds, fallback=fallback)
    if kind not in (int, float):  # a constrained item the model does not describe: the bound alone
        allowed, kind = fallback + _range(bounds), int if fallback == "an integer" else float
    nulls = " or null" if target is not None and target.nullable else ""
    return f"got {_shown(value)}; expected {allowed}{nulls}{_example(value, target, kind, bounds)}"


_ARM_WORDS = {"none": "null", "bool": "true or false", "int": "an integer", "float": "a number", "str": "a string",
              "bytes": "bytes"}


def _arm_words(arm: str, errors: list[Any], target: _Target | None) -> str:
    """What one union arm accepts: ``an integer``, ``a number in (0, 0.5)``, ``'auto'``, ``a list``
    (a constrained arm's bounds from the field's own type where ``target`` has it)."""
    literal = re.fullmatch(r"literal\[(.*)\]", arm)
    if literal:
        return " or ".join(v.strip() for v in literal.group(1).split(","))
    base = arm.removeprefix("constrained-")
    if base in _ARM_WORDS:
        bounds = {k: v for e in errors for k, v in (e.get("ctx") or {}).items() if k in ("gt", "ge", "lt", "le")}
        for option in get_args(target.kind) if target is not None and arm != base else ():
            kind, metadata, _ = _unwrapped(option)
            if getattr(kind, "__name__", None) == base and metadata:
                bounds = {**_bounds(_Target(kind=kind, metadata=tuple(metadata)), None), **bounds}
                break
        return _ARM_WORDS[base] + _range(bounds)
    if base.startswith(("list[", "tuple[", "set[")):
        return "a list"
    if base.startswith("dict["):
        return "a mapping"
    return base


def _no_arm(arms: dict[str, list[Any]], value: Any, target: _Target | None) -> str:
    """``got VALUE (a TYPE); expected WHAT EACH ARM ACCEPTS`` for a value no arm of a union took."""
    words = list(dict.fromkeys(_arm_words(arm, errors, target) for arm, errors in arms.items()))
    got = f"got {_shown(value)}" + ("" if value is None else f" ({_kind_of(value)})")
    return f"{got}; expected {_one_of(words)}"
