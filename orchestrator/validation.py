"""How spectune's config models validate, and how their errors read.

:class:`StrictModel` (no type coercion, no NaN or infinity) and :func:`validation_problems`, which
turns pydantic's errors into one readable problem per field for every command.
"""

from __future__ import annotations

import difflib
import re
import reprlib
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from orchestrator.errors import SpecProblem

__all__ = ["StrictModel", "short_repr", "validation_problems"]


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


_UNION_ARM = re.compile(r"^(none|bool|int|float|str|bytes|[a-z][a-z-]*\[.*\])$")
"""How pydantic labels the arm of a union in an error's location (``str``, ``list[int]``, ...)."""

_SUBFIELD = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*): (.*)$")
"""A validator's message line ``sub.field: message`` names a field below the one it validated."""

_NO_INPUT = ("missing", "value_error", "assertion_error", "extra_forbidden")
"""Error types whose message already says what is wrong without quoting the input."""


def validation_problems(exc: ValidationError, *, model: type[BaseModel] | None = None) -> list[SpecProblem]:
    """One readable problem per field and message, for any pydantic model's ``ValidationError``.

    - the field is the user's dotted path (pydantic's union-arm labels removed);
    - a value no arm of a union accepts is one problem listing the arms, not one per arm;
    - an unknown key lists the keys allowed there, with a "did you mean" when one is close
      (``model`` is the validated model, whose fields are the allowed keys);
    - the offending value is quoted (cut short) unless the message already says it;
    - a validator's multi-line message becomes one problem per line, and a line that starts with
      ``sub.field: `` is filed under that sub-field.

    Args:
        exc: What ``model_validate`` raised.
        model: The model that was validated, for the allowed keys of an unknown-key problem.
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

    unions: dict[str, tuple[list[str], Any]] = {}  # field -> (arms tried, value), in first-seen order
    for error in exc.errors():
        loc = [str(part) for part in error["loc"]]
        arm = next((i for i, part in enumerate(loc) if _UNION_ARM.match(part)), None)
        if arm is not None:
            field = ".".join(loc[:arm])
            arms, value = unions.setdefault(field, ([], error.get("input")))
            if loc[arm] not in arms:
                arms.append(loc[arm])
            if len(loc) == arm + 1:  # the value the union was given, not an item inside one arm
                unions[field] = (arms, error.get("input"))
            continue
        if loc and loc[-1] == "[key]":  # pydantic's marker for a mapping key that failed
            add(".".join(loc[:-1]), f"keys must be strings, got {short_repr(error.get('input'))}")
            continue
        field = ".".join(loc)
        message = str(error["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
        if error["type"] == "extra_forbidden":
            key = loc[-1] if loc else ""
            allowed = _allowed_keys(model, loc[:-1]) if model is not None else []
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            message = f"unknown key{hint}; allowed here: {', '.join(allowed)}" if allowed else f"unknown key{hint}"
        elif "input" in error and error["type"] not in _NO_INPUT:
            message = f"{message} (got {short_repr(error['input'])})"
        add(field, message)
    for field, (arms, value) in unions.items():
        add(field, f"must be one of {', '.join(arms)} (got {short_repr(value)})")
    return problems


def _allowed_keys(model: type[BaseModel], path: list[str]) -> list[str]:
    """Field names of the model found at ``path`` inside ``model`` (for "did you mean")."""
    for part in path:
        field = model.model_fields.get(part)
        if field is None:
            return []
        annotation = field.annotation
        candidates = [annotation, *getattr(annotation, "__args__", ())]
        nested = [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]
        if not nested:
            return []
        model = nested[0]
    return list(model.model_fields)
