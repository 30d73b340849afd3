"""An engine log's lines with the TP rank that wrote each: SGLang prefixes a rank's lines
``[2026-12-05 10:00:00 TP3]`` (with DP/PP/EP parts where those are on, ``[... DP0 TP3 EP3]``); the
reference engine logs the same. One definition for every reader of per-rank lines (the all-reduce
observation, the engine contract, a start's phases). Standard library only."""

from __future__ import annotations

import re
from typing import Iterator

__all__ = ["rank_lines"]

_RANK_PREFIX = re.compile(r"^\[[^\]\n]*?\bTP(\d+)\b[^\]\n]*\]")


def rank_lines(log_text: str) -> Iterator[tuple[int | None, str]]:
    """``(rank, the rest of the line)`` per line; rank None (and the whole line) where no rank prefixed it."""
    for line in (log_text or "").splitlines():
        found = _RANK_PREFIX.match(line)
        yield (int(found.group(1)), line[found.end():]) if found else (None, line)
