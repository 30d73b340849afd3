"""The confirmation round: the best few configurations and SGLang's default, re-measured on fresh
engines, interleaved (A B C D A B C D ...), before a winner is named.

A search ranks configurations by a few repetitions each, taken at different times on a machine
whose speed drifts; the top of that ranking is partly noise. Re-measuring the candidates in
alternation, each visit on a fresh engine, spreads the drift evenly over them, and the verdict is
a ratio with an interval: "steps=3 topk=1 draft=4: x1.07 [1.04, 1.10] over SGLang's default", or
"not distinguishable from SGLang's default" when the interval includes 1.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

from orchestrator.spec import SweepSpec
from orchestrator.sweep.results import Ratio, TrialRecord, ratio_interval

__all__ = ["Confirmation", "confirmation_candidates", "run_confirmation", "verdict"]

logger = logging.getLogger(__name__)


@dataclass
class Confirmation:
    """What the round measured and concluded.

    Attributes:
        values: Trial number -> objective values of all its visits, in order.
        failures: Trial number -> reasons of visits that failed.
        winner: Trial number with the best median (None if nothing was measured).
        default: Trial number of SGLang's default (the auto baseline), if it took part.
        ratio: The winner against SGLang's default, oriented so > 1 is better.
        lines: The verdict in words.
    """

    values: dict[int, list[float]] = field(default_factory=dict)
    failures: dict[int, list[str]] = field(default_factory=dict)
    winner: int | None = None
    default: int | None = None
    ratio: Ratio | None = None
    lines: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"values": {str(k): v for k, v in self.values.items()},
                "failures": {str(k): v for k, v in self.failures.items()}, "winner": self.winner,
                "default": self.default, "ratio": self.ratio.model_dump() if self.ratio else None, "lines": self.lines}


def _key(direction: str) -> Callable[[TrialRecord], float]:
    return (lambda r: -(r.value or 0.0)) if direction == "max" else (lambda r: r.value or 0.0)


def confirmation_candidates(records: list[TrialRecord], *, top_k: int) -> list[TrialRecord]:
    """The ``top_k`` best complete, feasible trials, then SGLang's default if it is not among them."""
    complete = [r for r in records if r.status == "ok" and r.complete and r.value is not None]
    if not complete:
        return []
    direction = complete[0].objective.direction  # type: ignore[union-attr]
    chosen = sorted(complete, key=_key(direction))[:top_k]
    auto = next((r for r in complete if r.kind == "baseline_auto"), None)
    if auto is not None and auto not in chosen:
        chosen.append(auto)
    return chosen


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def verdict(confirmation: Confirmation, records: dict[int, TrialRecord], *, direction: str) -> Confirmation:
    """Name the winner (best median over its visits) and state it against SGLang's default."""
    measured = {n: v for n, v in confirmation.values.items() if v}
    if not measured:
        confirmation.lines = ["confirmation: no visit measured anything; the search's best stands unconfirmed"]
        return confirmation
    best = max(measured, key=lambda n: _median(measured[n]) * (1 if direction == "max" else -1))
    confirmation.winner = best
    label = records[best].label
    default = confirmation.default
    if default is None or default not in measured:
        confirmation.lines = [f"confirmed best: trial {best} {label} (SGLang's default was not re-measured)"]
        return confirmation
    if best == default:
        confirmation.lines = [f"confirmed best: SGLang's default (trial {best}); nothing measured beat it"]
        return confirmation
    a, b = measured[best], measured[default]
    ratio = ratio_interval(a, b) if direction == "max" else ratio_interval(b, a)
    confirmation.ratio = ratio
    if ratio is None:
        text = "no comparison with SGLang's default"
    elif ratio.ci95_low is not None and not ratio.distinguishable:
        text = f"not distinguishable from SGLang's default ({ratio.text()})"
    else:
        text = f"{ratio.text()} over SGLang's default"
    confirmation.lines = [f"confirmed best: trial {best} {label}: {text}"]
    return confirmation


def run_confirmation(
    spec: SweepSpec, records: list[TrialRecord], *, visit: Callable[[TrialRecord, int], dict[str, Any]],
    say: Callable[[str], None],
) -> Confirmation | None:
    """Interleave the visits: every candidate once per round, ``spec.confirmation.rounds`` rounds.

    Args:
        visit: Runs one visit of a record's engine (round number given) and returns
            ``{"values", "status", "reason", "message"}`` (``trial.run_visit``'s shape).
        say: One line of progress for the job log.
    """
    settings = spec.confirmation
    candidates = confirmation_candidates(records, top_k=settings.top_k)
    if len(candidates) < 2:
        return None
    confirmation = Confirmation(default=next((r.number for r in candidates if r.kind == "baseline_auto"), None))
    total = settings.rounds * len(candidates)
    done = 0
    for round_number in range(settings.rounds):
        for record in candidates:
            done += 1
            outcome = visit(record, round_number)
            if outcome["status"] == "ok":
                confirmation.values.setdefault(record.number, []).extend(outcome["values"])
                shown = ", ".join(f"{v:.4g}" for v in outcome["values"])
                say(f"[confirm {done}/{total}] trial {record.number} {record.label}: {spec.objective.metric} {shown}")
            else:
                confirmation.failures.setdefault(record.number, []).append(f"{outcome['reason']}: {outcome['message']}")
                say(f"[confirm {done}/{total}] trial {record.number} {record.label}: {outcome['reason']}")
    return verdict(confirmation, {r.number: r for r in records}, direction=spec.objective.direction)
