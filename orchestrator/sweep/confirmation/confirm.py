"""The sequential confirmation: the search's best few, SGLang's default and no speculation,
re-measured on fresh engines in interleaved rounds until the verdict against SGLang's default is
decided, shown infeasible, or ``confirmation.max_visits`` rounds ran.

* **Contenders**: the ``confirmation.top_k`` best complete search trials, SGLang's default (never
  also visited under another name) and no speculation.
* **Rounds**: every contender still racing once per round on a fresh engine, the order reversed
  every other round; a visit's value is the geometric mean of its repetitions.
* **One rule** for every comparison, the verdict and the racing alike: ``orchestrator.sequential.judge``
  on the per-round log ratios (95% over all looks; a search contender's tests at alpha / the number
  of search contenders).
* **Racing**: a search contender the leader is better than, no speculation once the default and
  the leader are each better than it, and the default once the leader's verdict against it is
  decided, are no longer visited; a pick the spread could not settle within ``max_visits`` is not
  raced further from half of ``max_visits`` on.
* **The choice**: the leader if it is better (its interval above 1; the verdict says apart whether
  it also clears the margin); otherwise SGLang's default; no speculation where the chosen
  configuration is worse than it.

Each visit is handed to ``on_visit`` as it ends; visits passed in as ``done`` are not run again.
**Extension** (``spectune sweep --resume DIR --max-visits N``, ``extend_to``): the design's looks
grow to ``N`` with a stage of its own at alpha the main design held in reserve
(``orchestrator.sequential``); the stage is recorded through ``on_visit`` (a ``design`` line,
``extension.design_record``) before the first visit made under it, and read back from ``done``.
docs/confirmation.md gives the reasons.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from orchestrator.sequential import (
    MAX_LOOK,
    Design,
    LookDecision,
    critical_value,
    decisive_look,
    extend,
    judge,
    main_design,
    pairs_to_clear,
    visits_to_decide,
)
from orchestrator.spec import SweepSpec
from orchestrator.statistics import MIN_VALUES, geometric_mean
from orchestrator.sweep.confirmation.extension import (
    DESIGN_KEY,
    describe_design,
    design_record,
    extension_problem,
    recorded_design,
    spec_design,
)
from orchestrator.sweep.confirmation.margin import confirmation_margin
from orchestrator.sweep.confirmation.economy import VisitEconomy, engine_prior, visit_economy
from orchestrator.sweep.output.cost import format_duration, visit_estimate_s
from orchestrator.sweep.records.results import TrialRecord

__all__ = ["Confirmation", "Contender", "choose_contenders", "margin_clause", "run_confirmation"]

logger = logging.getLogger(__name__)

Visit = Callable[..., dict[str, Any]]
"""``visit(record, round_number, repetitions=n)`` runs one visit of a record's engine with ``n``
repetitions of the objective's level; returns ``{"values", "status", "reason", "message"}`` and,
where known, ``"timings": {"engine_start": s, "bench": s}`` (the visit economy reads them) and
``"host_cpu_steal"`` (a visit over ``confirmation.max_host_cpu_steal`` is recorded as discarded)."""


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
        visits: Every visit, ``{"trial", "round", "values", "value", "status", "reason", "message",
            "host_cpu_steal"}`` and, from a real engine, ``"engine_nodes"``; status ``ok``, ``failed``
            or ``discarded`` (measured under CPU steal).
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
    min_visits: int = 3
    wall_s: float = 0.0
    searched: int = 0
    """Search contenders at the start: the leader's tests run at alpha / searched (it is picked from them)."""
    economy: VisitEconomy | None = None
    """Variance components, start and repetition time, and the repetitions per visit they chose."""
    repetitions: int = 1
    """Repetitions per visit now (``confirmation.repetitions_per_visit``, or chosen by the economy)."""
    infeasible: str | None = None
    """Why the round stopped before ``max_visits`` without a decision (the feasibility sentence)."""
    design: Design = ()
    """The sequential design's stages (``orchestrator.sequential``): the main design, then any
    extensions. ``max_visits`` is its last look where it was extended (else the spec's cap)."""
    time_limit: tuple[float, str] | None = None
    """The rounds' time, in minutes, and the setting it comes from (``confirmation.max_minutes``,
    ``budget.time_limit_s's remainder`` or ``--max-minutes``)."""
    visit_s: float | None = None
    """One visit's expected seconds (``cost.visit_estimate_s``): what continuing would take."""
    results_dir: str | None = None
    """Where the sweep's results are (the command that continues it names it)."""
    continuation: dict[str, Any] | None = None
    """How an undecided verdict could be continued: ``{"command", "max_visits", "rounds", "visits", "minutes"}``."""

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
            "visits_made": sum(1 for v in self.visits if v.get("status") == "ok" or v.get("reason")),
            "repetitions_per_visit": self.repetitions, "searched_contenders": self.searched,
            "economy": self.economy.to_dict() if self.economy else None, "infeasible": self.infeasible,
            "error_control": "Lan-DeMets O'Brien-Fleming alpha spending over the looks, one-sided 2.5% per claim, "
                             "the leader's tests Bonferroni-corrected for the search contenders it was picked from "
                             "(orchestrator/sequential.py)",
            **self._design_dict(),
        }

    def _design_dict(self) -> dict[str, Any]:
        """The stages (``[[first, last, alpha], ...]``: the main design's alpha, then each extension's;
        their sum at most 2.5%, a union bound), the extension in words and how to continue; nothing
        for a Confirmation built without a design."""
        if not self.design:
            return {}
        return {"design": [s.to_list() for s in self.design], "extension": describe_design(self.design) or None,
                "continuation": self.continuation}


def _usable(records: Iterable[TrialRecord]) -> list[TrialRecord]:
    return [r for r in records if r.status == "ok" and r.complete and r.value is not None]


def choose_contenders(records: list[TrialRecord], *, top_k: int, no_speculation: bool = True) -> list[Contender]:
    """The ``top_k`` best complete search trials, SGLang's default, then no speculation (unless
    ``no_speculation`` is False: ``confirmation.no_speculation``).

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
    out += [Contender("no_speculation", plain)] if plain is not None and no_speculation else []
    return out


def _diffs(confirmation: Confirmation, a: int, b: int) -> list[float]:
    """Per-round log ratios of ``a`` over ``b`` (oriented: > 0 means ``a`` is better), rounds where both ran."""
    first, second = confirmation.series(a), confirmation.series(b)
    if confirmation.direction == "min":
        first, second = second, first
    return [math.log(x) - math.log(y) for x, y in zip(first, second) if x and y and x > 0 and y > 0]


def _is_searched(confirmation: Confirmation, record: TrialRecord) -> bool:
    return any(c.record is record and c.role not in ("default", "no_speculation") for c in confirmation.contenders)


def _design(confirmation: Confirmation) -> Design:
    """The design the looks are judged by: the confirmation's stages (a Confirmation built by hand
    without them: the main design over ``min_visits..max_visits``)."""
    if confirmation.design:
        return confirmation.design
    last = max(MIN_VALUES, confirmation.max_visits)
    return main_design(min(max(MIN_VALUES, confirmation.min_visits), last), last)


def _comparisons(confirmation: Confirmation, a: TrialRecord) -> int:
    """A search contender is picked as leader from the search contenders: its tests run at alpha / their number."""
    return max(1, confirmation.searched) if _is_searched(confirmation, a) else 1


def _look(confirmation: Confirmation, a: TrialRecord, b: TrialRecord) -> LookDecision:
    """``a`` against ``b`` at this look, by the sequential design (``orchestrator.sequential.judge``)."""
    return judge(_diffs(confirmation, a.number, b.number), margin=confirmation.margin, design=_design(confirmation),
                 comparisons=_comparisons(confirmation, a))


def _verdict(confirmation: Confirmation, a: TrialRecord, b: TrialRecord) -> dict[str, Any]:
    """``a`` against ``b`` at this look, by the sequential design (``orchestrator.sequential``): the
    claim and its interval, 95% over all looks; a search contender (picked as leader from the same
    visits) is judged at alpha / the number of search contenders."""
    comparisons = _comparisons(confirmation, a)
    design = _design(confirmation)
    look = _look(confirmation, a, b)
    needed = None
    if look.claim == "undecided" and look.log_sd:
        # optimistic by one standard error: the fewest visits a plausible true ratio would need, so a
        # first look's unlucky mean does not end a round that could still decide
        se = look.log_sd / math.sqrt(look.pairs)
        mean = math.log(look.ratio)  # signed: better is reachable only above 1
        estimates = [visits_to_decide(log_mean=m, log_sd=look.log_sd, margin=confirmation.margin, design=design,
                                      comparisons=comparisons) for m in _plausible_means(mean, se)]
        known = [n for n in estimates if n is not None]
        needed = min(known) if known else None
    if not look.pairs:
        text = "not measured"
    elif look.low is None:
        text = f"x{look.ratio:.2f} (no decision possible yet at {look.pairs} visits)"
    else:
        text = f"x{look.ratio:.2f} [{look.low:.2f}, {look.high:.2f}]"
    return {
        "kind": look.claim, "ratio": look.ratio if look.pairs else None, "ci95_low": look.low, "ci95_high": look.high,
        "visits": look.pairs, "margin": confirmation.margin, "comparisons": comparisons,
        "critical": look.critical if math.isfinite(look.critical) else None,
        "log_sd": look.log_sd, "between_visit_cv": look.log_sd / math.sqrt(2) if look.log_sd else None,
        "trial": a.number, "label": a.label, "against_trial": b.number, "against_label": b.label,
        "visits_needed": needed, "text": text, "clears_margin": look.clears_margin,
    }


def _plausible_means(mean: float, se: float) -> tuple[float, ...]:
    """The log ratios one standard error either side of ``mean`` and, where that range holds it, 0:
    the points at which ``sequential.decision_distance`` can be largest over the range (the fewest
    visits a plausible true ratio would need to decide)."""
    return (mean + se, mean - se, 0.0) if mean - se < 0.0 < mean + se else (mean + se, mean - se)


def _early_look_note(confirmation: Confirmation, verdict: dict[str, Any]) -> str:
    """Why an early look's interval is wide, in one clause: its boundary is stricter than the last
    look's (O'Brien-Fleming spending keeps most of alpha for the end); empty where that is not so."""
    critical, visits = verdict.get("critical"), verdict.get("visits")
    if critical is None or verdict.get("ci95_low") is None:
        return ""
    design = _design(confirmation)
    last = design[-1].last
    final = critical_value(last, design=design, comparisons=verdict.get("comparisons", 1))
    if not math.isfinite(final) or visits is None or visits >= last or critical <= final * 1.05:
        return ""
    return (f"; the interval is wide because an early look is held to a strict boundary (O'Brien-Fleming spending: "
            f"critical {critical:.2f} at look {visits}, {final:.2f} at look {last}), {critical / final:.1f}x the "
            "width the last look allows")


def _leader(confirmation: Confirmation) -> TrialRecord | None:
    """The search contender with the best geometric mean over its visits."""
    sign = 1.0 if confirmation.direction == "max" else -1.0
    best: tuple[float, TrialRecord] | None = None
    for contender in confirmation.contenders:
        if contender.role in ("default", "no_speculation") or contender.record.number in confirmation.dropped:
            continue
        values = [v for v in confirmation.series(contender.record.number) if v is not None]
        center = geometric_mean(values)  # type: ignore[arg-type]
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
    """Search contenders still visited that the leader is not yet shown to be at most ``margin``
    slower than (the lower end of leader / contender, 95% over all looks as the verdict's, below
    1 / (1 + margin)), where the visits left could still show it: from half of ``max_visits`` on, a
    race the observed spread would not decide within ``max_visits`` is not worth its launches."""
    leader = _leader(confirmation)
    if leader is None:
        return []
    floor = math.log(1.0 / (1.0 + confirmation.margin))
    design = _design(confirmation)
    out = []
    for contender in confirmation.contenders:
        record = contender.record
        if contender.role in ("default", "no_speculation") or record is leader or record.number in confirmation.dropped:
            continue
        look = _look(confirmation, leader, record)
        if look.low is None:
            out.append(record)
        elif math.log(look.low) < floor:
            needed = pairs_to_clear(distance=math.log(look.ratio) - floor, log_sd=look.log_sd or 0.0, design=design,
                                    comparisons=_comparisons(confirmation, leader))
            if confirmation.rounds < _futility_round(confirmation) or (
                    needed is not None and needed <= confirmation.max_visits):
                out.append(record)
    return out


def _futility_round(confirmation: Confirmation) -> int:
    """The first round at which a race may be judged undecidable: half of ``max_visits``. Mean and
    spread from three pairs are too rough to call two contenders inseparable."""
    return math.ceil(confirmation.max_visits / 2)


def _race(confirmation: Confirmation) -> list[tuple[TrialRecord, str]]:
    """Contenders whose question is answered after this round, and why: a search contender the
    leader is decidedly better than; no speculation once SGLang's default and the leader (if any)
    are each decidedly better than it. The leader is always visited. "Decidedly" is the verdict's
    own rule (:func:`_verdict`, 95% over all looks)."""
    leader, default = _leader(confirmation), confirmation.role("default")
    out: list[tuple[TrialRecord, str]] = []
    for contender in confirmation.contenders:
        record = contender.record
        if record.number in confirmation.dropped or contender.role == "default" or record is leader:
            continue
        if contender.role == "no_speculation":  # its verdict is reported: judged as verdicts are
            verdicts = [_verdict(confirmation, judge, record) for judge in (default, leader) if judge is not None]
            if verdicts and all(v["kind"] == "better" for v in verdicts):
                out.append((record, "; ".join(f"trial {v['trial']} is better, {v['text']}" for v in verdicts)))
            continue
        if leader is not None:
            verdict = _verdict(confirmation, leader, record)
            if verdict["kind"] == "better":
                out.append((record, f"trial {leader.number} is better, {verdict['text']} (95% over all looks)"))
    return out


def _default_rests(confirmation: Confirmation) -> bool:
    """Whether SGLang's default sits this round out: the verdict of the current leader against it is
    decided and only the leader's race against the other search contenders is open. (Should
    another contender take the lead, the default is visited again until that verdict is decided.)"""
    leader, default = _leader(confirmation), confirmation.role("default")
    return leader is not None and default is not None and _verdict(confirmation, leader, default)["kind"] != "undecided"


def _conclude(confirmation: Confirmation, *, advise: bool = True) -> None:
    """The verdicts, the choice and the lines, from the visits made (an undecided verdict's with how
    to continue it where ``advise``)."""
    leader, default, plain = _leader(confirmation), confirmation.role("default"), confirmation.role("no_speculation")
    confirmation.leader = leader.number if leader else None
    margin = f"margin {confirmation.margin:.1%}, 95% over all looks"
    lines: list[str] = []
    chosen = default
    if leader is not None and default is not None:
        verdict = confirmation.vs_sglang_default = _verdict(confirmation, leader, default)
        kind, text, n = verdict["kind"], verdict["text"], verdict["visits"]
        head = f"verdict: trial {leader.number} {leader.label} vs SGLang's default ({default.label})"
        if kind == "better":
            chosen = leader
            lines.append(f"{head}: better, {text}; {margin_clause(verdict)}, from {n} interleaved visits each "
                         "(95% over all looks)")
        elif kind == "equivalent":
            lines.append(f"{head}: equivalent, {text} within ±{confirmation.margin:.0%} from {n} interleaved visits "
                         "each; best.yaml is SGLang's default, the simpler choice")
        elif kind == "worse":
            lines.append(f"{head}: worse, {text} from {n} interleaved visits each; best.yaml is SGLang's default")
        else:
            needed = verdict["visits_needed"]
            if confirmation.infeasible:
                hint = confirmation.infeasible
            elif verdict["ci95_low"] is None:
                set_aside = sum(1 for v in confirmation.visits if v["status"] != "ok")
                hint = (f"an interval needs 3 paired visits and {n} counted"
                        + (f" ({set_aside} visit(s) discarded or failed)" if set_aside else ""))
            elif needed:
                hint = f"at the observed spread about {needed} visits each would decide ({_cap_name(confirmation)})"
            else:
                hint = "the ratio sits on the margin: no practical number of visits would decide it"
            onward = _continuation(confirmation, verdict) if advise else ""
            if onward and (needed is not None or onward.startswith("continue")):  # the margin one says it already
                hint += f"; {onward}"
            side = ""  # an interval above 1 is "better": only the slower side can be left undecided
            if verdict["ci95_high"] is not None and verdict["ci95_high"] < 1.0:
                side = "; slower than SGLang's default, but not shown to be by more than the margin"
            strict = _early_look_note(confirmation, verdict)
            lines.append(f"{head}: undecided after {n} interleaved visits each, {text} ({margin}){side}{strict}; "
                         f"{hint}; best.yaml keeps SGLang's default")
        extended = describe_design(_design(confirmation))
        if extended:
            lines.append(f"  {extended}")
    elif default is not None and confirmation.searched:
        why = confirmation.infeasible or f"the {confirmation.rounds} round(s) ran"
        lines.append(f"verdict: undecided: no visit of the search's contenders counted before the round stopped "
                     f"({why}); best.yaml keeps SGLang's default ({default.label})")
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


def margin_clause(verdict: dict[str, Any], margin: float | None = None) -> str:
    """What a better verdict says of the practical margin, in one clause: whether its interval (95%
    over all looks) also lies above ``1 + margin`` (the verdict's ``margin``, else ``margin``)."""
    value = verdict.get("margin", margin)
    if value is None:
        return "the margin not judged"
    margin_text = f"{value:.1%}".replace(".0%", "%")
    if verdict.get("clears_margin"):
        return f"clears the {margin_text} margin"
    return f"not shown to clear the {margin_text} margin"


def _cap_name(confirmation: Confirmation) -> str:
    """What set the last look: ``--max-visits`` for an extended design, else ``confirmation.max_visits``."""
    return "--max-visits" if len(_design(confirmation)) > 1 else "confirmation.max_visits"


def _active(confirmation: Confirmation) -> int:
    """Contenders still visited (not dropped by the racing)."""
    return sum(1 for c in confirmation.contenders if c.record.number not in confirmation.dropped)


def _continuation(confirmation: Confirmation, verdict: dict[str, Any]) -> str:
    """How an undecided verdict could be continued, as one clause: the command (``spectune sweep
    --resume DIR``, with ``--max-visits N`` where deciding needs rounds past the design's last look,
    ``N`` the fewest by :func:`orchestrator.sequential.decisive_look` at the measured spread and
    a ratio one standard error from the measured one toward a decision (the basis of
    ``visits_needed``), and ``--max-minutes`` where time stopped it or the time limit would not cover it), the
    rounds and visits that adds and their time at ``cost.visit_estimate_s``; or why no extension
    would decide. Sets ``confirmation.continuation``. Empty where time stopped a round before any
    spread was measured."""
    design, rounds, pairs = _design(confirmation), confirmation.rounds, verdict["visits"] or 0
    last = design[-1].last
    if verdict["log_sd"] and verdict["ratio"]:
        # the basis of visits_needed (_verdict): the fewest visits a ratio one standard error from the
        # measured one, toward a decision, would need; here by the extension's own boundaries
        se, mean = verdict["log_sd"] / math.sqrt(pairs), math.log(verdict["ratio"])  # signed
        targets = [decisive_look(log_mean=m, log_sd=verdict["log_sd"], margin=confirmation.margin, design=design,
                                 comparisons=verdict["comparisons"]) for m in _plausible_means(mean, se)]
        known = [n for n in targets if n is not None]
        if not known:
            return (f"no extension up to {MAX_LOOK} visits could decide it at the measured spread "
                    "(a wider confirmation.margin could)")
        target, basis = min(known), "the fewest that could decide at the measured spread"
    elif rounds >= confirmation.max_visits:
        target, basis = max(last + 1, 2 * MIN_VALUES), "no spread measured yet to size it by"
    else:
        return ""
    more = max(1, target - pairs)  # rounds: each adds a pair where both visits count
    new_last = None if rounds + more <= confirmation.max_visits else max(last + 1, rounds + more)
    active = _active(confirmation)
    minutes = more * active * confirmation.visit_s / 60 if confirmation.visit_s else None
    command = f"spectune sweep --resume {confirmation.results_dir or 'RESULTS_DIR'}"
    if new_last is not None:
        command += f" --max-visits {new_last}"
    limit = confirmation.time_limit[0] if confirmation.time_limit else None
    if minutes is not None and (new_last is None or (limit is not None and limit < minutes)):
        command += f" --max-minutes {math.ceil(minutes * 1.25)}"
    cost = f"about {more} more round{'s' if more != 1 else ''} of {active} visits"
    cost += f", ~{format_duration(minutes * 60)} at the visit estimate" if minutes is not None else ""
    confirmation.continuation = {"command": command, "max_visits": new_last, "rounds": more,
                                 "visits": more * active, "minutes": round(minutes, 1) if minutes is not None else None}
    return f"continue with: {command} ({cost}; {basis})"


def _paired_for_economy(confirmation: Confirmation) -> list[tuple[list[float], list[int]]]:
    """Per search contender against SGLang's default: its per-round log ratios and each round's
    repetitions (the between-visit variance is read from them, drift cancelled by the pairing)."""
    default = confirmation.role("default")
    if default is None:
        return []
    reps = {(v["trial"], v["round"]): len(v.get("values") or []) for v in confirmation.visits if v["status"] == "ok"}
    out = []
    for contender in confirmation.contenders:
        if contender.role == "default":
            continue
        a, b = confirmation.series(contender.record.number), confirmation.series(default.number)
        rounds = [i for i, (x, y) in enumerate(zip(a, b)) if x and y]
        diffs = [math.log(a[i]) - math.log(b[i]) for i in rounds]  # type: ignore[arg-type]
        out.append((diffs, [max(reps.get((contender.record.number, i), 1), 1) for i in rounds]))
    return out


def _economy(spec: SweepSpec, records: list[TrialRecord], confirmation: Confirmation) -> VisitEconomy:
    """The visit economy now: the engine kind's prior below enough degrees of freedom, and the
    repetitions capped by the rounds' time left / the visits left (``economy.visit_economy``)."""
    fixed = spec.confirmation.repetitions_per_visit
    prior_cv, prior_name = engine_prior(spec)
    per_visit = None
    if confirmation.time_limit is not None:
        left = max(confirmation.max_visits - confirmation.rounds, 1) * max(_active(confirmation), 1)
        per_visit = max(confirmation.time_limit[0] * 60 - confirmation.wall_s, 0.0) / left
    return visit_economy(records=[r for r in records if r.kind == "search" or r.kind.startswith("baseline")],
                         visits=confirmation.visits, paired_diffs=_paired_for_economy(confirmation),
                         fixed=None if fixed == "auto" else int(fixed), prior_cv=prior_cv, prior_name=prior_name,
                         seconds_per_visit=per_visit)


def _feasibility(spec: SweepSpec, confirmation: Confirmation) -> str | None:
    """After a look without a verdict: the sentence that stops the round, or None to go on. It
    stops where, at the measured spread, deciding would take more visits than ``max_visits`` allows,
    or more time than the rounds' limit has left (``confirmation.time_limit``: ``confirmation.max_minutes``,
    the budget's remainder or ``--max-minutes``; a visit costs a start plus its repetitions, ``VisitEconomy``)."""
    leader, default, plain = _leader(confirmation), confirmation.role("default"), confirmation.role("no_speculation")
    a, b = (leader, default) if leader is not None else (default, plain)
    if a is None or b is None:
        return None
    verdict = _verdict(confirmation, a, b)
    if verdict["kind"] != "undecided" or not verdict["log_sd"]:
        return None
    economy = confirmation.economy
    visit_s = None
    if economy is not None and economy.start_s and economy.repetition_s:
        visit_s = economy.start_s + confirmation.repetitions * economy.repetition_s
    active = _active(confirmation)
    needed = verdict["visits_needed"]
    spread = f"at the measured between-visit spread {verdict['between_visit_cv']:.1%}"
    goal = f"deciding ±{confirmation.margin:.1%}"  # as the verdict's "margin 7.5%" reads it
    cost = "" if visit_s is None or needed is None else f" (~{needed * active * visit_s / 60:.0f} min)"
    if needed is None:
        return f"{spread}, {goal} takes more visits than any budget (the ratio, {verdict['text']}, sits on the margin)"
    if needed > confirmation.max_visits:
        return f"{spread}, {goal} takes about {needed} visits{cost}: more than {_cap_name(confirmation)} " \
               f"({confirmation.max_visits})"
    limit, setting = confirmation.time_limit or (spec.confirmation.max_minutes, "confirmation.max_minutes")
    if limit is not None and visit_s is not None:
        left_s = limit * 60 - confirmation.wall_s
        if (needed - verdict["visits"]) * active * visit_s > left_s:
            return f"{spread}, {goal} takes about {needed} visits{cost}: more than {setting} ({limit:g}) leaves"
    return None


def _out_of_time(max_minutes: float | None, elapsed_s: float, round_s: float | None, *,
                 setting: str = "confirmation.max_minutes") -> str | None:
    """The sentence that ends the round loop before a round ``confirmation.max_minutes`` has no
    time for (a round costs about what the last one did), or None. The bound holds with or without
    a measured spread: discarded or failed visits can leave the look nothing to judge."""
    if max_minutes is None or round_s is None:
        return None
    left_s = max_minutes * 60 - elapsed_s
    if round_s <= left_s:
        return None
    return (f"{setting} ({max_minutes:g}) leaves {math.floor(max(left_s, 0))} s, less than another "
            f"round takes (~{math.ceil(round_s)} s)")


def _discard_if_stolen(entry: dict[str, Any], limit: float | None) -> None:
    """Set aside a visit measured while the hypervisor ran other guests on this host's CPUs: its
    figure is the neighbours', not its configuration's. Steal does not depend on which contender
    runs, so setting such visits aside leaves the comparison unbiased; the round loses its pair."""
    steal = entry.get("host_cpu_steal")
    if entry["status"] != "ok" or limit is None or steal is None or steal <= limit:
        return
    entry.update(status="discarded", reason="host_cpu_steal",
                 message=f"the hypervisor gave {steal:.0%} of the host's CPU to other guests during it (over "
                         f"confirmation.max_host_cpu_steal {limit:.0%})")


def _time_limit(own: float | None, budget: float | None, given: float | None) -> tuple[float, str] | None:
    """The rounds' time in minutes and the setting it comes from: ``--max-minutes`` (``given``)
    where given, else the smaller of ``confirmation.max_minutes`` (``own``) and the budget's
    remainder (``budget``); None without either."""
    if given is not None:
        return given, "--max-minutes"
    if own is not None and (budget is None or budget >= own):
        return own, "confirmation.max_minutes"
    return (budget, "budget.time_limit_s's remainder") if budget is not None else None


def _start_design(spec: SweepSpec, done: list[dict[str, Any]], extend_to: int | None,
                  results_dir: str | None) -> tuple[Design, float, dict[str, Any] | None]:
    """The design to run under, the margin, and the design line still to record (None where
    nothing new): the last design recorded in ``done`` (else the spec's main design) and its
    margin (else the spec's), extended to ``extend_to`` looks where asked.

    Raises:
        ValueError: ``extend_to`` is not above the design's last look (``extension.extension_problem``).
    """
    recorded = recorded_design(done)
    design = recorded.stages if recorded is not None else spec_design(spec)
    margin = recorded.margin if recorded is not None and recorded.margin is not None else confirmation_margin(spec)
    if extend_to is None:
        return design, margin, None
    problem = extension_problem(spec, done, extend_to, results_dir=results_dir or "this results directory")
    if problem is not None:
        raise ValueError(problem)
    extended = extend(design, extend_to)
    return extended, margin, design_record(extended, margin=margin, extended_from=design[-1].last,
                                           at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))


def run_confirmation(
    spec: SweepSpec, records: list[TrialRecord], *, visit: Visit, say: Callable[[str], None],
    done: Iterable[dict[str, Any]] = (), on_visit: Callable[[dict[str, Any]], None] | None = None,
    clock: Callable[[], float] = time.monotonic, max_minutes: float | None = None,
    extend_to: int | None = None, given_minutes: float | None = None, results_dir: str | None = None,
    advise: bool = True,
) -> Confirmation | None:
    """Visit the contenders round by round until decided, shown infeasible, or ``confirmation.max_visits``
    rounds ran (an extended design's last look).

    Args:
        visit: Runs one visit (``visit.run_placed_visit``: ``trial.run_visit`` in a placement group; or a test double).
        say: One line of progress for the job log.
        done: confirmation.jsonl's lines from an earlier run: visits (not run again) and design lines
            (the design they were made under, ``extension.recorded_design``).
        on_visit: Called with each new visit's record as it ends (persisted for resume), and with a
            new design line before the first visit made under it.
        clock: Seconds, monotonic (``confirmation.max_minutes`` is read against it; tests pass their own).
        max_minutes: The confirmation's time, where the sweep's budget leaves less than
            ``confirmation.max_minutes`` (default: that setting).
        extend_to: ``--max-visits``: extend the design to this many looks (above its last), with a
            stage at alpha held in reserve. The stage is recorded only once a visit is made under it,
            and the feasibility stop is not applied to the rounds read back (it was asked for).
        given_minutes: ``--max-minutes``: the rounds' time in this run, instead of both of the above.
        results_dir: Where the sweep's results are (named in the command that would continue it).
        advise: Work out how an undecided verdict could be continued (``Confirmation.continuation``:
            simulates an extension's boundaries, up to a second); simulations of many confirmations
            (``benchmarks/verdict_operating_characteristic.py``) leave it out.

    Returns:
        None when there are fewer than two contenders or no SGLang default to judge against.

    Raises:
        ValueError: ``extend_to`` is not above the design's last look.
    """
    settings = spec.confirmation
    contenders = choose_contenders(records, top_k=settings.top_k, no_speculation=settings.no_speculation)
    if len(contenders) < 2 or not any(c.role == "default" for c in contenders):
        return None
    done = [dict(v) for v in done]
    design, margin, pending = _start_design(spec, done, extend_to, results_dir)
    started = clock()
    confirmation = Confirmation(contenders=contenders, margin=margin, direction=spec.objective.direction,
                                max_visits=design[-1].last if len(design) > 1 else settings.max_visits,
                                min_visits=settings.min_visits, design=design, results_dir=results_dir,
                                time_limit=_time_limit(settings.max_minutes, max_minutes, given_minutes),
                                searched=sum(1 for c in contenders if c.role not in ("default", "no_speculation")))
    numbers = {c.record.number for c in contenders}
    confirmation.visits = [v for v in done if DESIGN_KEY not in v and v.get("trial") in numbers]
    seen = {(v["trial"], v["round"]) for v in confirmation.visits}
    confirmation.economy = _economy(spec, records, confirmation)
    confirmation.repetitions = confirmation.economy.repetitions_per_visit
    say(f"confirmation: {', '.join(f'{c.role} = trial {c.record.number} {c.record.label}' for c in contenders)}; "
        f"{settings.min_visits}-{confirmation.max_visits} fresh-engine visits each, interleaved, until the verdict "
        f"against SGLang's default is decided (better: the interval above 1; equivalent or worse: margin "
        f"{margin:.1%}; 95% over all looks, alpha spent by "
        f"O'Brien-Fleming, the leader's tests at 2.5%/{max(1, confirmation.searched)} one-sided)"
        + (f"; {len(seen)} visits resumed" if seen else ""))
    if len(design) > 1:
        say(f"confirmation: {describe_design(design)}")
    say(confirmation.economy.line())
    time_limit = confirmation.time_limit
    round_s: float | None = None  # the last round's wall time: what the next one will about cost
    for round_number in range(confirmation.max_visits):
        out_of_time = _out_of_time(time_limit[0] if time_limit else None, clock() - started, round_s,
                                   setting=time_limit[1] if time_limit else "confirmation.max_minutes")
        if out_of_time is not None:
            confirmation.infeasible = out_of_time
            say(f"confirmation: stopped after round {confirmation.rounds}: {out_of_time}")
            break
        round_started = clock()
        resting = round_number >= settings.min_visits and _default_rests(confirmation)
        confirmation.rounds = round_number + 1
        order = contenders if round_number % 2 == 0 else list(reversed(contenders))
        for contender in order:
            record = contender.record
            if (record.number, round_number) in seen or record.number in confirmation.dropped:
                continue
            if resting and contender.role == "default":
                continue
            if pending is not None and on_visit is not None:  # the extension, before its first visit
                on_visit(pending)
            pending = None
            outcome = visit(record, round_number, repetitions=confirmation.repetitions)
            values = [float(v) for v in outcome.get("values", []) if isinstance(v, (int, float))]
            entry = {"trial": record.number, "round": round_number, "values": values, "value": geometric_mean(values),
                     "status": outcome["status"] if values or outcome["status"] != "ok" else "failed",
                     "reason": outcome.get("reason") or (None if values else "no_values"),
                     "message": outcome.get("message", ""), "repetitions": confirmation.repetitions,
                     "timings": dict(outcome.get("timings") or {}), "host_cpu_steal": outcome.get("host_cpu_steal"),
                     **({"engine_nodes": outcome["engine_nodes"]} if outcome.get("engine_nodes") else {})}
            _discard_if_stolen(entry, settings.max_host_cpu_steal)
            confirmation.visits.append(entry)
            if on_visit is not None:
                on_visit(entry)
            measured = entry["status"] in ("ok", "discarded")
            shown = ", ".join(f"{v:.4g}" for v in values) if measured else entry["reason"]
            if entry["status"] == "discarded":
                shown += f", discarded: {entry['message']}"
            say(f"[confirm round {round_number + 1}/{confirmation.max_visits}] trial {record.number} {record.label} "
                f"({contender.role}): {spec.objective.metric} {shown}")
        confirmation.wall_s = clock() - started
        round_s = clock() - round_started
        if confirmation.rounds < settings.min_visits:
            continue
        if _decided(confirmation):
            break
        economy = _economy(spec, records, confirmation)
        if economy.repetitions_per_visit != confirmation.repetitions:
            say(f"confirmation: {economy.line()}")
        confirmation.economy, confirmation.repetitions = economy, economy.repetitions_per_visit
        # an extension overrules the stop its rounds read back would have made: asked for, it runs
        infeasible = _feasibility(spec, confirmation) if pending is None else None
        if infeasible is not None:
            confirmation.infeasible = infeasible
            say(f"confirmation: stopped after round {confirmation.rounds}: {infeasible}")
            break
        for record, why in _race(confirmation):
            confirmation.dropped[record.number] = confirmation.rounds
            say(f"confirmation: trial {record.number} {record.label} is no longer visited after round "
                f"{confirmation.rounds}: {why}")
    if pending is not None:  # no visit was made under the extension: it is not recorded, nor described
        confirmation.design = design[:-1]
        confirmation.max_visits = design[-2].last if len(design) > 2 else settings.max_visits
        say(f"confirmation: --max-visits {extend_to} made no visit: "
            + (confirmation.infeasible or "the verdict was decided before the extension's first round"))
    confirmation.visit_s = visit_estimate_s(spec, records)
    _conclude(confirmation, advise=advise)
    discarded = [v for v in confirmation.visits if v["status"] == "discarded"]
    if discarded:
        confirmation.lines.append(
            f"  {len(discarded)} of {len(confirmation.visits)} visits discarded: the hypervisor gave over "
            f"{settings.max_host_cpu_steal:.0%} of the host's CPU to other guests during them (up to "
            f"{max(v['host_cpu_steal'] for v in discarded):.0%}; confirmation.max_host_cpu_steal): a quieter "
            "machine decides in fewer visits")
    if not settings.no_speculation and any(r.kind == "baseline_plain" for r in _usable(records)):
        confirmation.lines.append("  no speculation: not visited (confirmation.no_speculation: false); the gain over "
                                  "it is the search's estimate above, from trials measured minutes apart")
    confirmation.wall_s = clock() - started
    return confirmation
