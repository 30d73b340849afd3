"""Extending a confirmation: ``spectune sweep --resume DIR --max-visits N`` continues an undecided
(or interrupted) confirmation past its last look, at alpha the main design held in reserve
(``orchestrator.sequential``: :func:`~orchestrator.sequential.main_design`,
:func:`~orchestrator.sequential.extend`).

The design in force is recorded in ``confirmation.jsonl`` itself, as a line ``{"design": {...}}``
appended (flushed, fsynced, like every visit) before the first visit it governs: its stages
``[[first, last, alpha], ...]``, the margin the sweep started with, and when it was extended. A
resumed confirmation reads the last such line (a torn one is skipped, as a torn visit is); without
one, the design is the spec's main design. So a second extension knows the first, and a replay
of the file (``benchmarks/replay_confirmation.py``) judges the visits by the design they were made
under.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from orchestrator.sequential import (
    ALPHA,
    MAX_LOOK,
    Design,
    Stage,
    check_design,
    design_alpha,
    main_design,
)
from orchestrator.spec import SweepSpec
from orchestrator.statistics import MIN_VALUES
from orchestrator.sweep.records.results import CONFIRMATION_FILE

__all__ = [
    "DESIGN_KEY",
    "RecordedDesign",
    "describe_design",
    "design_record",
    "extension_problem",
    "read_confirmation_lines",
    "recorded_design",
    "spec_design",
]

logger = logging.getLogger(__name__)

DESIGN_KEY = "design"
"""The key of a design line in ``confirmation.jsonl`` (a visit line has ``trial`` instead)."""


@dataclass(frozen=True)
class RecordedDesign:
    """The design a confirmation runs under: its stages and the margin it started with (None:
    the spec's, ``confirmation_margin``)."""

    stages: Design
    margin: float | None = None

    @property
    def last(self) -> int:
        """The last look, in pairs (visits per contender)."""
        return self.stages[-1].last

    @property
    def extended(self) -> bool:
        return len(self.stages) > 1


def spec_design(spec: SweepSpec) -> Design:
    """The main design of ``spec``'s confirmation: looks ``min_visits..max_visits`` (each at least
    three pairs: an interval needs three), ``ALPHA x (1 - EXTENSION_RESERVE)``."""
    settings = spec.confirmation
    last = max(MIN_VALUES, settings.max_visits)
    first = min(max(MIN_VALUES, settings.min_visits), last)
    return main_design(first, last)


def design_record(design: Design, *, margin: float, extended_from: int, at: str | None = None) -> dict[str, Any]:
    """The ``confirmation.jsonl`` line that records ``design`` (written before its first visit)."""
    return {DESIGN_KEY: {"stages": [s.to_list() for s in design], "margin": margin, "extended_from": extended_from,
                         "extended_to": design[-1].last, **({"at": at} if at else {})}}


def recorded_design(entries: Iterable[dict[str, Any]]) -> RecordedDesign | None:
    """The last valid design line among ``entries`` (confirmation.jsonl's lines), or None. A line
    that does not describe a valid design (hand-edited, from another version) is skipped with a
    warning: the visits are still judged, by the spec's design."""
    found: RecordedDesign | None = None
    for entry in entries:
        body = entry.get(DESIGN_KEY) if isinstance(entry, dict) else None
        if not isinstance(body, dict):
            continue
        try:
            stages = tuple(Stage(int(first), int(last), float(alpha)) for first, last, alpha in body["stages"])
            check_design(stages)
            margin = body.get("margin")
            found = RecordedDesign(stages, float(margin) if margin is not None else None)
        except (KeyError, TypeError, ValueError) as exc:
            logger.warning("confirmation.jsonl: a design line that is not a valid design skipped (%s): %s", exc, body)
    return found


def read_confirmation_lines(results_dir: Path) -> list[dict[str, Any]]:
    """``results_dir``'s confirmation.jsonl, line by line (none where it is absent; a torn line
    skipped, as the sweep's writer does)."""
    path = Path(results_dir) / CONFIRMATION_FILE
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            out.append(entry)
    return out


def extension_problem(spec: SweepSpec, entries: Iterable[dict[str, Any]], max_visits: int, *,
                      results_dir: str) -> str | None:
    """Why ``--max-visits max_visits`` cannot extend the confirmation recorded in ``entries``
    (one sentence naming the flag, the value and what is allowed), or None where it can."""
    if not spec.confirmation.enabled:
        return (f"--max-visits {max_visits}: the sweep in {results_dir} runs without a confirmation "
                "(confirmation.enabled: false in its spec.yaml); there is nothing to extend")
    recorded = recorded_design(entries)
    stages = recorded.stages if recorded is not None else spec_design(spec)
    current = stages[-1].last
    before = (f" (extended from {stages[0].last} to {current} before)" if len(stages) > 1
              else f" (confirmation.max_visits {spec.confirmation.max_visits})")
    if max_visits <= current:
        return (f"--max-visits {max_visits}: the confirmation in {results_dir} already looks up to {current} visits "
                f"per contender{before}; give a number above {current} (at most {MAX_LOOK}), or leave --max-visits "
                "out to finish the current design")
    if max_visits > MAX_LOOK:
        return (f"--max-visits {max_visits}: at most {MAX_LOOK} visits per contender (the boundaries' simulation "
                f"holds that many looks); give a number above {current} and at most {MAX_LOOK}")
    return None


def describe_design(stages: Design) -> str:
    """The extension clause of the verdict: ``extended from 3 to 8 visits; one-sided alpha 0.025 =
    0.020 main design (looks 3-3) + 0.0025 extension 1 (looks 4-8) + 0.0025 held for later
    extensions (union bound)``; empty for a design never extended."""
    if len(stages) < 2:
        return ""
    parts = [f"{_alpha(stages[0].alpha)} main design (looks {stages[0].first}-{stages[0].last})"]
    parts += [f"{_alpha(s.alpha)} extension {j} (looks {s.first}-{s.last})" for j, s in enumerate(stages[1:], 1)]
    held = ALPHA - design_alpha(stages)
    if held > 1e-12:
        parts.append(f"{_alpha(held)} held for later extensions")
    return (f"extended from {stages[0].last} to {stages[-1].last} visits; one-sided alpha {_alpha(ALPHA)} per claim = "
            + " + ".join(parts) + " (a union bound over the stages; docs/confirmation.md)")


def _alpha(value: float) -> str:
    """An alpha in the fewest digits that show it: 0.025, 0.020, 0.0025, 0.00125."""
    if value >= 0.01:
        return f"{value:.3f}"
    digits = max(1, -math.floor(math.log10(value)) + 2)
    return f"{value:.{digits}f}".rstrip("0")
