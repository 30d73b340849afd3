"""The range checks the command line and the request validation share (stdlib only).

Messages name the field as the client spelled it, the value, and what is allowed.
"""

from __future__ import annotations

import math
from typing import Optional

__all__ = ["SEED_MAX", "SEED_MIN", "check_finite", "check_int", "show"]

SEED_MIN = -(2**63)
"""Smallest seed ``torch.Generator.manual_seed`` accepts (negative seeds wrap around)."""
SEED_MAX = 2**64 - 1
"""Largest seed ``torch.Generator.manual_seed`` accepts (beyond: ``Overflow when unpacking long long``)."""

_SHOWN_CHARS = 80


def show(value: object) -> str:
    """``repr(value)``, cut short: an error message must stay readable whatever the client sent."""
    try:
        text = repr(value)
    except ValueError:  # an int too long to print (Python's int max str digits)
        return f"<{type(value).__name__} too large to print>"
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."


def check_int(value: object, *, name: str, low: Optional[int] = None, high: Optional[int] = None) -> int:
    """``value`` if it is an integer (not a bool) in ``[low, high]``; else ``ValueError``.

    The message names ``name``, the value and the allowed range, e.g. ``--port must be an integer
    in [1, 65535], got 70000`` or ``sampling_params.max_new_tokens must be at least 0, got -1``.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        allowed = f" in [{low}, {high}]" if low is not None and high is not None else ""
        raise ValueError(f"{name} must be an integer{allowed}, got {show(value)}")
    if (low is not None and value < low) or (high is not None and value > high):
        if high is None:
            raise ValueError(f"{name} must be at least {low}, got {show(value)}")
        if low is None:
            raise ValueError(f"{name} must be at most {high}, got {show(value)}")
        raise ValueError(f"{name} must be an integer in [{low}, {high}], got {show(value)}")
    return value


def check_finite(value: object, *, name: str) -> float:
    """``value`` as a float if it is a finite number (not a bool, NaN or infinity); else ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {show(value)}")
    try:
        number = float(value)
    except OverflowError:  # an int beyond float's range
        number = math.inf
    if not math.isfinite(number):
        raise ValueError(f"{name} must be a finite number, got {show(value)}")
    return number

