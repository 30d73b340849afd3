"""The sequential confirmation: the search's best few, SGLang's default and no speculation,
re-measured on fresh engines in interleaved rounds until the verdict against SGLang's default is
decided, or the visit cap is reached.

A search ranks configurations by a few repetitions each, taken at different times on a machine
whose speed drifts; the top of that ranking is partly noise (two sweeps of one spec on one H200
named winners x1.10 and x0.78 against SGLang's default). So the verdict comes from here:

* **Contenders**: the ``confirmation.top_k`` best complete search trials (three by default: under
  noise the true best is often the search's second or third), SGLang's default (the auto
  baseline, whose resolved point is never also visited under another name) and no speculation
  as the floor.
* **Rounds**: every contender still racing once per round, each visit on a fresh engine, the order
  reversed every other round (A B C D, D C B A, ...) so linear drift falls evenly on all of them.
  A visit's value is the geometric mean of its repetitions.
* **Two questions**, judged after each round from ``min_visits`` on, paired by round
  (``statistics.paired_ratio``): the *verdict*, the leader (the best search contender over its
  visits) against SGLang's default with the practical margin (``statistics.decide``: ``better``,
  ``equivalent``, ``worse``, or, at ``max_visits``, ``undecided`` with the visits the observed
  spread would need); and the *pick*, whether the leader is settled: no other search contender
  still racing could be more than the margin faster than it. The round ends when both are
  answered. From half of ``max_visits`` on, a pick the observed spread could not settle within
  ``max_visits`` (two contenders closer than the noise resolves) is not raced further: those
  launches would decide nothing.
* **Racing**: a contender whose question is answered stops being visited: a search contender the
  leader is decidedly better than; no speculation once SGLang's default and the leader are each
  decidedly better than it; SGLang's default while the leader's verdict against it is decided
  (visited again should another contender take the lead). ``benchmarks/search_efficiency.py``
  measures what the round buys and costs, in launches.
* **The choice**: the leader if it is better; otherwise SGLang's default (the simpler choice);
  and no speculation where the chosen configuration is decidedly worse than it.

Every visit is handed to ``on_visit`` as it ends (the coordinator appends it to
``confirmation.jsonl``), and visits passed in as ``done`` are not run again: a resumed sweep
resumes its confirmation.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from orchestrator.spec import SweepSpec
from orchestrator.statistics import MIN_VALUES, Ratio, decide, half_width, paired_ratio, visits_needed
from orchestrator.sweep.results import TrialRecord

__all__ = ["Confirmation", "Contender", "choose_contenders", "run_confirmation"]

logger = logging.getLogger(__name__)

Visit = Callable[[TrialRecord, int], dict[str, Any]]
"""Runs one visit of a record's engine (round given); returns ``{"values", "status", "reason", "message"}``."""


@dataclass(frozen=True)
class Contender:
    """One configuration of the round and why it is there (``best``, ``runner_up``, ``default``, ``no_speculation``)."""

    role: str
    record: TrialRecord


@dataclass
class Confirmation:
    """What the round measured and concluded.

    Attributes:
        contenders: In visiting order.
        visits: Every visit, ``{"trial", "round", "values", "value", "status", "reason", "message"}``.
        leader: The best search contender over its visits (None without one).
        chosen: The trial whose configuration best.yaml holds.
        vs_sglang_default / vs_no_speculation: ``{"kind", "ratio", "ci95_low", "ci95_high", "visits", ...}``.
        lines: The verdict in words.
    """

    contenders: list[Contender]
    margin: float
    direction: str
    visits: list[dict[str, Any]] = field(default_factory=list)
    leader: int | None = None
    chosen: int | None = None
    vs_sglang_default: dict[str, Any] | None = None
    vs_no_speculation: dict[str, Any] | None = None
    lines: list[str] = field(default_factory=list)
    dropped: dict[int, int] = field(default_factory=dict)
    """Trial number -> the round after which it stopped being visited (racing)."""
    rounds: int = 0
    max_visits: int = 0
    wall_s: float = 0.0

    def role(self, role: str) -> TrialRecord | None:
        return next((c.record for c in self.contenders if c.role == role), None)

    def series(self, number: int) -> list[float | None]:
        """Per-round value of trial ``number`` (None where its visit failed or did not run)."""
        out: list[float | None] = [None] * self.rounds
        for v in self.visits:
            if v["trial"] == number and v["status"] == "ok" and v["value"] is not None and v["round"] < self.rounds:
                out[v["round"]] = v["value"]
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "contenders": [{"role": c.role, "trial": c.record.number, "label": c.record.label} for c in self.contenders],
            "visits": self.visits, "rounds": self.rounds, "margin": self.margin, "leader": self.leader,
            "chosen": self.chosen, "vs_sglang_default": self.vs_sglang_default,
            "vs_no_speculation": self.vs_no_speculation, "lines": self.lines,
            "dropped": {str(k): v for k, v in self.dropped.items()}, "wall_s": round(self.wall_s, 1),
        }


def _usable(records: Iterable[TrialRecord]) -> list[TrialRecord]:
    return [r for r in records if r.status == "ok" and r.complete and r.value is not None]


def choose_contenders(records: list[TrialRecord], *, top_k: int) -> list[Contender]:
    """The ``top_k`` best complete search trials, SGLang's default, then no speculation.

    A search trial that ran as SGLang's default (the point auto resolved to) is the default, not a
    contender of its own: one configuration is never visited twice under two names.
    """
    usable = _usable(records)
    if not usable:
        return []
    sign = 1.0 if usable[0].objective.direction == "max" else -1.0  # type: ignore[union-attr]
    default = next((r for r in usable if r.kind == "baseline_auto"), None)
    plain = next((r for r in usable if r.kind == "baseline_plain"), None)
    taken = {default.ran_as()} if default is not None else set()
    searched: list[TrialRecord] = []
    for record in sorted((r for r in usable if r.kind == "search"), key=lambda r: -sign * (r.value or 0.0)):
        if record.ran_as() not in taken and len(searched) < top_k:
            taken.add(record.ran_as())
            searched.append(record)
    roles = ["best", "runner_up"] + [f"top_{i}" for i in range(3, top_k + 1)]
    out = [Contender(role, record) for role, record in zip(roles, searched)]
    out += [Contender("default", default)] if default is not None else []
    out += [Contender("no_speculation", plain)] if plain is not None else []
    return out


def _geomean(values: list[float]) -> float | None:
    positive = [v for v in values if isinstance(v, (int, float)) and v > 0]
    return math.exp(sum(math.log(v) for v in positive) / len(positive)) if positive else None


def _oriented(confirmation: Confirmation, a: int, b: int) -> Ratio | None:
    """Trial ``a`` against trial ``b``, paired by round, > 1 meaning ``a`` is better."""
    first, second = confirmation.series(a), confirmation.series(b)
    if confirmation.direction == "min":
        first, second = second, first
    return paired_ratio(first, second)


def _verdict(confirmation: Confirmation, a: TrialRecord, b: TrialRecord) -> dict[str, Any]:
    ratio = _oriented(confirmation, a.number, b.number)
    kind = decide(ratio, margin=confirmation.margin)
    return {
        "kind": kind, "ratio": ratio.ratio if ratio else None,
        "ci95_low": ratio.ci95_low if ratio else None, "ci95_high": ratio.ci95_high if ratio else None,
        "visits": ratio.visits if ratio else 0, "margin": confirmation.margin,
        "trial": a.number, "label": a.label, "against_trial": b.number, "against_label": b.label,
        "visits_needed": visits_needed(ratio, margin=confirmation.margin) if kind == "undecided" else None,
        "text": ratio.text() if ratio else "not measured",
    }


def _leader(confirmation: Confirmation) -> TrialRecord | None:
    """The search contender with the best geometric mean over its visits."""
    sign = 1.0 if confirmation.direction == "max" else -1.0
    best: tuple[float, TrialRecord] | None = None
    for contender in confirmation.contenders:
        if contender.role in ("default", "no_speculation") or contender.record.number in confirmation.dropped:
            continue
        values = [v for v in confirmation.series(contender.record.number) if v is not None]
        center = _geomean(values)  # type: ignore[arg-type]
        if center is not None and (best is None or sign * center > best[0]):
            best = (sign * center, contender.record)
    return best[1] if best else None


def _decided(confirmation: Confirmation) -> bool:
    """Whether the round has its answers: the verdict (the leader against SGLang's default; without a
    search contender, the default against no speculation) is decided, and the leader is settled:
    no other search contender still visited could be more than ``margin`` faster than it
    (:func:`_unsettled` is empty). The second question is what makes the pick the true best under noise, not
    just something better than SGLang's default."""
    leader, default, plain = _leader(confirmation), confirmation.role("default"), confirmation.role("no_speculation")
    a, b = (leader, default) if leader is not None else (default, plain)
    if a is None or b is None:
        return False
    return _verdict(confirmation, a, b)["kind"] != "undecided" and not _unsettled(confirmation)


def _unsettled(confirmation: Confirmation) -> list[TrialRecord]:
    """Search contenders still visited that the leader is not yet known to be at most ``margin``
    slower than (the lower end of leader / contender below 1 / (1 + margin)), where the visits
    left could still show it: a race the observed spread would not decide within ``max_visits``
    (two contenders closer than the noise can resolve) is not worth its launches."""
    leader = _leader(confirmation)
    if leader is None:
        return []
    floor = 1.0 / (1.0 + confirmation.margin)
    out = []
    for contender in confirmation.contenders:
        record = contender.record
        if contender.role in ("default", "no_speculation") or record is leader or record.number in confirmation.dropped:
            continue
        ratio = _oriented(confirmation, leader.number, record.number)
        if ratio is None or ratio.ci95_low is None:
            out.append(record)
        elif ratio.ci95_low < floor and (confirmation.rounds < _futility_round(confirmation)
                                         or _decidable(ratio, floor, confirmation.max_visits)):
            out.append(record)
    return out


def _futility_round(confirmation: Confirmation) -> int:
    """The first round at which a race may be judged undecidable: half of ``max_visits``. Mean and
    spread from three pairs are too rough to call two contenders inseparable (it would stop the
    race exactly when they merely look close)."""
    return math.ceil(confirmation.max_visits / 2)


def _decidable(ratio: Ratio, floor: float, cap: int) -> bool:
    """Whether, at the observed mean and spread, at most ``cap`` pairs would lift the lower end of
    ``ratio``'s interval above ``floor``."""
    distance = math.log(ratio.ratio) - math.log(floor)
    if distance <= 0 or not ratio.log_sd:
        return distance > 0
    return any(half_width(ratio.log_sd, n) < distance for n in range(max(MIN_VALUES, ratio.visits), cap + 1))


def _race(confirmation: Confirmation) -> list[tuple[TrialRecord, str]]:
    """Contenders whose question is answered after this round, and why: a search contender the
    leader is decidedly better than; no speculation once SGLang's default and the leader (if any)
    are each decidedly better than it. The leader is always visited."""
    leader, default = _leader(confirmation), confirmation.role("default")
    out: list[tuple[TrialRecord, str]] = []
    for contender in confirmation.contenders:
        record = contender.record
        if record.number in confirmation.dropped or contender.role == "default" or record is leader:
            continue
        judges = [leader] if contender.role != "no_speculation" else [r for r in (default, leader) if r is not None]
        verdicts = [_verdict(confirmation, judge, record) for judge in judges if judge is not None]
        if verdicts and all(v["kind"] == "better" for v in verdicts):
            out.append((record, "; ".join(f"trial {v['trial']} is better, {v['text']}" for v in verdicts)))
    return out


def _default_rests(confirmation: Confirmation) -> bool:
    """Whether SGLang's default sits this round out: the verdict of the current leader against it is
    decided and only the leader's race against the other search contenders is open. (Should
    another contender take the lead, the default is visited again until that verdict is decided.)"""
    leader, default = _leader(confirmation), confirmation.role("default")
    return leader is not None and default is not None and _verdict(confirmation, leader, default)["kind"] != "undecided"


def _conclude(confirmation: Confirmation) -> None:
    """The verdicts, the choice and the lines, from the visits made."""
    leader, default, plain = _leader(confirmation), confirmation.role("default"), confirmation.role("no_speculation")
    confirmation.leader = leader.number if leader else None
    margin = f"margin {confirmation.margin:.0%}"
    lines: list[str] = []
    chosen = default
    if leader is not None and default is not None:
        verdict = confirmation.vs_sglang_default = _verdict(confirmation, leader, default)
        kind, text, n = verdict["kind"], verdict["text"], verdict["visits"]
        head = f"verdict: trial {leader.number} {leader.label} vs SGLang's default ({default.label})"
        if kind == "better":
            chosen = leader
            lines.append(f"{head}: better, {text} from {n} interleaved visits each ({margin})")
        elif kind == "equivalent":
            lines.append(f"{head}: equivalent, {text} within ±{confirmation.margin:.0%} from {n} interleaved visits "
                         "each; best.yaml is SGLang's default, the simpler choice")
        elif kind == "worse":
            lines.append(f"{head}: worse, {text} from {n} interleaved visits each; best.yaml is SGLang's default")
        else:
            needed = verdict["visits_needed"]
            if verdict["ci95_low"] is None:
                hint = f"an interval needs {MIN_VALUES} visits of each (confirmation.max_visits)"
            elif needed:
                hint = f"at the observed spread about {needed} visits each would decide (confirmation.max_visits)"
            else:
                hint = "the ratio sits on the margin: no practical number of visits would decide it"
            lines.append(f"{head}: undecided after {n} interleaved visits each, {text} ({margin}); {hint}; "
                         "best.yaml keeps SGLang's default")
    elif default is not None:
        lines.append(f"verdict: no search trial completed apart from SGLang's default ({default.label}); best.yaml "
                     "is SGLang's default")
    if chosen is not None and plain is not None:
        floor = confirmation.vs_no_speculation = _verdict(confirmation, chosen, plain)
        lines.append(f"  {chosen.label} vs no speculation: {floor['kind']}, {floor['text']} ({floor['visits']} visits)")
        if floor["kind"] == "worse":
            chosen = plain
            lines.append("  no speculation is faster than every speculative configuration measured here: best.yaml "
                         "turns speculation off")
    confirmation.chosen = chosen.number if chosen is not None else None
    confirmation.lines = lines


def run_confirmation(
    spec: SweepSpec, records: list[TrialRecord], *, visit: Visit, say: Callable[[str], None],
    done: Iterable[dict[str, Any]] = (), on_visit: Callable[[dict[str, Any]], None] | None = None,
) -> Confirmation | None:
    """Visit the contenders round by round until decided or ``confirmation.max_visits`` rounds ran.

    Args:
        visit: Runs one visit (``visit.run_placed_visit``: ``trial.run_visit`` in a placement group; or a test double).
        say: One line of progress for the job log.
        done: Visits an earlier (interrupted) run of this confirmation made; not run again.
        on_visit: Called with each new visit's record as it ends (persisted for resume).

    Returns:
        None when there are fewer than two contenders or no SGLang default to judge against.
    """
    settings = spec.confirmation
    contenders = choose_contenders(records, top_k=settings.top_k)
    if len(contenders) < 2 or not any(c.role == "default" for c in contenders):
        return None
    started = time.monotonic()
    confirmation = Confirmation(contenders=contenders, margin=settings.margin, direction=spec.objective.direction,
                                max_visits=settings.max_visits)
    numbers = {c.record.number for c in contenders}
    confirmation.visits = [dict(v) for v in done if v.get("trial") in numbers]
    seen = {(v["trial"], v["round"]) for v in confirmation.visits}
    say(f"confirmation: {', '.join(f'{c.role} = trial {c.record.number} {c.record.label}' for c in contenders)}; "
        f"{settings.min_visits}-{settings.max_visits} fresh-engine visits each, interleaved, until the verdict against "
        f"SGLang's default is decided (margin {settings.margin:.0%})" + (f"; {len(seen)} visits resumed" if seen else ""))
    for round_number in range(settings.max_visits):
        resting = round_number >= settings.min_visits and _default_rests(confirmation)
        confirmation.rounds = round_number + 1
        order = contenders if round_number % 2 == 0 else list(reversed(contenders))
        for contender in order:
            record = contender.record
            if (record.number, round_number) in seen or record.number in confirmation.dropped:
                continue
            if resting and contender.role == "default":
                continue
            outcome = visit(record, round_number)
            values = [float(v) for v in outcome.get("values", []) if isinstance(v, (int, float))]
            entry = {"trial": record.number, "round": round_number, "values": values, "value": _geomean(values),
                     "status": outcome["status"] if values or outcome["status"] != "ok" else "failed",
                     "reason": outcome.get("reason") or (None if values else "no_values"),
                     "message": outcome.get("message", "")}
            confirmation.visits.append(entry)
            if on_visit is not None:
                on_visit(entry)
            shown = ", ".join(f"{v:.4g}" for v in values) if entry["status"] == "ok" else entry["reason"]
            say(f"[confirm round {round_number + 1}/{settings.max_visits}] trial {record.number} {record.label} "
                f"({contender.role}): {spec.objective.metric} {shown}")
        if confirmation.rounds < settings.min_visits:
            continue
        if _decided(confirmation):
            break
        for record, why in _race(confirmation):
            confirmation.dropped[record.number] = confirmation.rounds
            say(f"confirmation: trial {record.number} {record.label} is no longer visited after round "
                f"{confirmation.rounds}: {why}")
    _conclude(confirmation)
    confirmation.wall_s = time.monotonic() - started
    return confirmation
