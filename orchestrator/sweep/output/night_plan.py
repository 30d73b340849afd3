"""The night planned up front: the sweep's trials and confirmation as a timeline against
``budget.time_limit_s``, what to change where it does not fit, and the chance that it decides.

A trial costs what ``cost.trial_cost`` says (the estimate the budget and the limits read too): its engine
start plus what runs on the engine: the probe, and per concurrency level the warm-up and the most
repetitions (``cost.benchmark_estimate_s``: requests x ``output_len`` x the per-token time,
``budget.tpot_estimate_ms`` until a trial has measured it; then the trials' medians). The first wave's cold
starts add their extra once (assumed ``cost.COLD_START_FACTOR`` until measured). Every figure's basis says
measured (where, when), assumed (from what) or the spec's; the plan says the start time at which it stops
fitting (:meth:`NightPlan.fits_up_to_start_s`) and, where it does not fit, what the sweep would cut
(:meth:`NightPlan.cut_line`).
The timeline follows the searcher's own order (``DefineByRunSpace``): the baselines, SGLang's rules of
thumb, one start per all-reduce path and NCCL setting (each named with the hour it is first started),
then the search; then the confirmation, ``contenders x min_visits..max_visits`` visits at the visit
estimate. An arm whose first start does one-off work (``cost.first_start_extras``: PCIe-IPC's tuning)
adds it once, at the trial that first starts it. The plan *fits* when the search and the confirmation at ``max_visits`` end within the limit.
Where it does not, :func:`changes_to_fit` re-plans the spec and offers only changes that fit.
:func:`decision_chance` simulates the confirmation's sequential test (the sweep's own boundaries,
``sequential.judge``'s claims) at a between-visit spread; :func:`decision_lines` states it across the
spreads of :func:`decision_spreads`, each labelled.

The running sweep re-plans from what it measures (``execution.time_budget``); this is the promise
made before the night starts. Pure functions of the spec (and records): no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable

from orchestrator.spec import SweepSpec
from orchestrator.statistics import MIN_VALUES
from orchestrator.sweep.output.cost import (
    COLD_START_FACTOR, first_start_extras, format_duration, planned_starts, trial_cost, visit_estimate_s,
)
from orchestrator.sweep.records.results import TrialRecord

__all__ = ["NightPlan", "PlanStep", "UNDECIDED_MORNING", "changes_to_fit", "decision_chance", "decision_lines",
           "decision_spreads", "fit_warning", "night_plan", "plan_lines"]

DECISION_PATHS = 4000
"""Simulated confirmations per :func:`decision_chance` figure (seeded): +-1.6% at a chance of 50%."""

STATED_VISIT_CVS = (0.02, 0.04)
"""Between-visit spreads the plan's decision chance is also stated at (assumed, plausible): between the
GPU figures spectune measured (~1% between visits on one H200, ~7% between starts on one H100;
``margin.GPU_FIGURES``)."""


@dataclass(frozen=True)
class PlanStep:
    """One stretch of the timeline.

    Attributes:
        at_s: When it begins, seconds from the sweep's start.
        first, last: Its trial numbers (1-based; both 0 for the confirmation).
        what: What runs, in words.
    """

    at_s: float
    first: int
    last: int
    what: str


@dataclass(frozen=True)
class NightPlan:
    """A sweep's plan as a timeline (:func:`night_plan`).

    Attributes:
        start_s, bench_s: One engine start; what runs on the engine after it (probe, warm-up, benchmark).
        start_basis, bench_basis: Where each figure comes from, in words.
        trials: ``budget.num_trials``.
        parallel: ``budget.max_concurrent_trials``.
        contenders, min_visits, max_visits: The confirmation's (0 contenders: off).
        visit_s: One confirmation visit.
        limit_s: ``budget.time_limit_s``.
        steps: The timeline.
        settings_first: (setting, trial number, hour it starts) for each all-reduce path and NCCL setting.
        extras: (trial number, seconds, why) for each one-off cost a trial's start adds (``first_start_extras``).
        cold_s, cold_basis: What the first wave's cold starts add once (``cost.trial_cost``), and why.
        cold_factor: The assumed cold/warm ratio where ``cold_s`` is assumed (it scales with the start), else None.
    """

    start_s: float
    bench_s: float
    start_basis: str
    bench_basis: str
    trials: int
    parallel: int
    contenders: int
    min_visits: int
    max_visits: int
    visit_s: float
    limit_s: float | None
    steps: tuple[PlanStep, ...] = field(default=())
    settings_first: tuple[tuple[str, int, float], ...] = field(default=())
    extras: tuple[tuple[int, float, str], ...] = field(default=())
    cold_s: float = 0.0
    cold_basis: str = ""
    cold_factor: float | None = None

    @property
    def trial_s(self) -> float:
        return self.start_s + self.bench_s

    def _extras_before(self, number: int) -> float:
        """One-off costs of the trials before ``number``: the first wave's cold starts, the arms' first starts."""
        cold = self.cold_s if number > self.parallel else 0.0
        return cold + sum(seconds for at, seconds, _ in self.extras if at < number)

    def at_start(self, start_s: float) -> "NightPlan":
        """This plan at another warm start time: trials and visits each start once more or less; an assumed
        cold start scales with it, a measured one and the arms' one-off costs do not."""
        cold = self.cold_s if self.cold_factor is None else (self.cold_factor - 1.0) * start_s
        return NightPlan(**{**self.__dict__, "start_s": start_s, "visit_s": self.visit_s - self.start_s + start_s,
                            "cold_s": cold})

    def fits_up_to_start_s(self) -> float | None:
        """The warm start time at which the plan stops fitting (the night is linear in it); None without a
        limit, 0 where it fits at no start time."""
        if self.limit_s is None:
            return None
        at0, at1 = self.at_start(0.0).total_s, self.at_start(1.0).total_s
        slope = at1 - at0
        if slope <= 0:
            return None
        return max(0.0, (self.limit_s - at0) / slope)

    def trial_at_s(self, number: int) -> float:
        """When trial ``number`` (1-based) starts, trials running ``parallel`` at a time."""
        return (number - 1) // self.parallel * self.trial_s + self._extras_before(number)

    def search_s(self, trials: int | None = None) -> float:
        trials = self.trials if trials is None else trials
        return math.ceil(trials / self.parallel) * self.trial_s + self._extras_before(trials + 1)

    def confirmation_s(self, visits: int) -> float:
        return self.contenders * visits * self.visit_s

    @property
    def total_s(self) -> float:
        """The search and the confirmation at ``max_visits``."""
        return self.search_s() + self.confirmation_s(self.max_visits)

    @property
    def fits(self) -> bool:
        return self.limit_s is None or self.total_s <= self.limit_s

    def affordable_trials(self) -> int | None:
        """The most trials that leave the confirmation its least time (``min_visits``) within the limit,
        as the running sweep stops the search (None without a limit)."""
        if self.limit_s is None:
            return None
        left = self.limit_s - self.confirmation_s(self.min_visits) - self._extras_before(self.trials + 1)
        return min(self.trials, max(0, int(left // self.trial_s) * self.parallel)) if left > 0 else 0

    def affordable_visits(self, trials: int) -> int:
        """Visits per contender the limit leaves after ``trials`` search trials (``max_visits`` at most)."""
        if self.limit_s is None or not self.contenders:
            return self.max_visits
        left = self.limit_s - self.search_s(trials)
        return max(0, min(self.max_visits, int(left // (self.contenders * self.visit_s)))) if left > 0 else 0

    def cut_line(self) -> str:
        """What the running sweep would cut where the plan does not fit (``execution.time_budget``: the
        search stops starting trials once the next would leave the confirmation less than ``min_visits``
        rounds; the confirmation then gets what is left)."""
        trials = self.affordable_trials() or 0
        visits = self.affordable_visits(trials)
        search = (f"the search would stop after about {trials} of its {self.trials} trials" if trials < self.trials
                  else f"all {self.trials} trials run")
        if not self.contenders:
            return search
        confirm = (f"the confirmation would get time for about {visits} of its {self.max_visits} visits per contender"
                   + (f" (below min_visits {self.min_visits}: it decides nothing)" if visits < self.min_visits else ""))
        return f"{search}; {confirm}"


def night_plan(spec: SweepSpec, records: Iterable[TrialRecord] = ()) -> NightPlan:
    """The plan of ``spec``'s sweep, from ``records`` where trials have ended (else the spec's estimates)."""
    from orchestrator.space.define_by_run import DefineByRunSpace

    records = list(records)
    cost = trial_cost(spec, records)  # the one estimate of a trial (the budget and the limits read it too)
    starts = planned_starts(spec)
    plan = NightPlan(start_s=cost.start_s, bench_s=cost.after_start_s, start_basis=cost.start_basis,
                     bench_basis=cost.run_basis, cold_s=cost.cold_extra_s, cold_basis=cost.cold_basis,
                     cold_factor=COLD_START_FACTOR if cost.cold_basis.startswith("assumed") else None,
                     trials=spec.budget.num_trials, parallel=spec.budget.max_concurrent_trials,
                     contenders=starts.contenders, min_visits=min(spec.confirmation.min_visits, starts.max_visits),
                     max_visits=starts.max_visits, visit_s=visit_estimate_s(spec, records),
                     limit_s=spec.budget.time_limit_s)
    space = DefineByRunSpace(spec)
    baselines = space.baselines()
    extras = _extras(spec, records, [*baselines, *space.opening()], plan.trials)
    plan = NightPlan(**{**plan.__dict__, "extras": extras})
    stages = [(len(baselines), "baselines: " + ", ".join(
        "no speculation" if p.kind == "baseline_plain" else "SGLang's own choice" for p in baselines))]
    settings_first: tuple[tuple[str, int, float], ...] = ()
    for part, plans in space.opening_stages():
        first = sum(n for n, _ in stages) + 1  # its first trial number
        if part == "settings":
            settings_first = tuple((_setting_label(p), n, plan.trial_at_s(n))
                                   for n, p in enumerate(plans, start=first) if n <= plan.trials)
            chain = plans[0].candidate.speculative
            what = (f"every all-reduce path and NCCL setting at steps={chain.num_steps} topk={chain.eagle_topk} "
                    f"draft={chain.num_draft_tokens}")
        else:
            what = {"chains": "SGLang's chain and the longest chain (its histogram predicts the shorter ones): ",
                    "shortest": "the shortest chain (the cycle line's other end; SGLang's chain predicted from the "
                                "two ends checks the model): ",
                    "rules": "SGLang's other rules of thumb: "}[part] + "; ".join(p.label() for p in plans)
        stages.append((len(plans), what))
    stages.append((max(0, plan.trials - sum(n for n, _ in stages)), "the search (Optuna TPE)"))
    steps, number = [], 1
    for count, what in stages:
        count = min(count, plan.trials - number + 1)
        if count <= 0:
            continue
        steps.append(PlanStep(plan.trial_at_s(number), number, number + count - 1, what))
        number += count
    if plan.contenders:
        steps.append(PlanStep(plan.search_s(), 0, 0, "confirmation"))
    return NightPlan(**{**plan.__dict__, "steps": tuple(steps), "settings_first": settings_first})


def _extras(spec: SweepSpec, records: list[TrialRecord], opening: list, trials: int) -> tuple[tuple[int, float, str], ...]:
    """Each one-off first-start cost at the opening trial that first starts its arm, else at the search's
    first trial (the searcher may start it any time after)."""
    out = []
    for arm, (seconds, why) in first_start_extras(spec, records).items():
        number = next((n for n, p in enumerate(opening, start=1) if p.candidate.all_reduce == arm), len(opening) + 1)
        if number <= trials:
            out.append((number, seconds, f"{arm}'s first start: {why}"))
    return tuple(out)


def _setting_label(plan) -> str:
    """``nccl``, ``nccl NCCL_ALGO=Ring``, ``NCCL_PROTO=LL`` (the path where it is not the default one)."""
    candidate = plan.candidate
    env = " ".join(f"{k}={v}" for k, v in sorted(candidate.nccl_env.items()))
    path = "" if candidate.all_reduce == "default" else candidate.all_reduce
    return " ".join(part for part in (path, env) if part) or "default"


def _clock(seconds: float) -> str:
    """Hours into the night: ``0h00m``, ``5h39m``."""
    minutes = int(round(seconds / 60))
    return f"{minutes // 60}h{minutes % 60:02d}m"


def plan_lines(plan: NightPlan) -> list[str]:
    """The plan as a timeline, a line a stretch, then whether it fits."""
    at = format_duration
    lines = [f"plan: {plan.trials} trials, {plan.parallel} at a time (the spec's budget); a trial = a start "
             f"{at(plan.start_s)} ({plan.start_basis}) + {at(plan.bench_s)} on the engine ({plan.bench_basis})"]
    if plan.cold_s > 0:
        lines.append(f"  the first {'start adds' if plan.parallel == 1 else f'{plan.parallel} starts add'} "
                     f"{at(plan.cold_s)} once: a node's cold first start ({plan.cold_basis})")
    lines += [f"  trial {number} adds {at(seconds)} once ({why})" for number, seconds, why in plan.extras]
    for step in plan.steps:
        if step.first == 0:
            low, high = plan.confirmation_s(plan.min_visits), plan.confirmation_s(plan.max_visits)
            lines.append(f"  {_clock(step.at_s):>6}  confirmation: {plan.contenders} contenders x {plan.min_visits}-"
                         f"{plan.max_visits} visits (the spec's confirmation) x {at(plan.visit_s)} (a start, its "
                         f"teardown and the visit's repetitions, at the figures above) = {at(low)} to {at(high)}")
            continue
        trials = f"trial {step.first}" if step.first == step.last else f"trials {step.first}-{step.last}"
        lines.append(f"  {_clock(step.at_s):>6}  {trials}: {step.what}")
        if step.what.startswith("every all-reduce") and plan.settings_first:
            lines.append("          first started: " + ", ".join(
                f"{label} at {_clock(hour)}" for label, _, hour in plan.settings_first))
    end = _clock(plan.total_s)
    if plan.limit_s is None:
        lines.append(f"  {end:>6}  end at max_visits (no budget.time_limit_s: nothing bounds the night)")
    elif plan.fits:
        lines.append(f"  {end:>6}  end at max_visits: fits budget.time_limit_s ({at(plan.limit_s)}); "
                     f"{_start_margin(plan)}")
    else:
        lines.append(f"  {end:>6}  end at max_visits: does NOT fit budget.time_limit_s ({at(plan.limit_s)}); "
                     f"{plan.cut_line()}; {_start_margin(plan)}")
    return lines


def _start_margin(plan: NightPlan) -> str:
    """``fits up to 11.2-minute starts (planned: 10.0)``: the warm start time at which the plan stops fitting."""
    limit = plan.fits_up_to_start_s()
    if limit is None:
        return ""
    unit, scale = ("minute", 60.0) if max(limit, plan.start_s) >= 120 else ("second", 1.0)
    if limit <= 0:
        return "it fits at no start time (the night's other parts alone exceed the limit)"
    return (f"{'fits' if plan.fits else 'it would fit'} up to {limit / scale:.1f}-{unit} starts (planned: "
            f"{plan.start_s / scale:.1f}"
            + (f"; the cold first start scales with it" if plan.cold_factor else "") + ")")


def _replanned(spec: SweepSpec, records: list[TrialRecord], changes: dict[str, dict]) -> tuple[SweepSpec, NightPlan]:
    data = spec.model_dump()
    for section, values in changes.items():
        data[section] = {**data[section], **values}
    changed = SweepSpec.model_validate(data)
    return changed, night_plan(changed, records)


def _merge(a: dict[str, dict], b: dict[str, dict]) -> dict[str, dict]:
    return {section: {**a.get(section, {}), **b.get(section, {})} for section in {*a, *b}}


def _fewest_trials(plan: NightPlan) -> int:
    """No fewer trials than the baselines, the rules of thumb and one start per setting."""
    return max((s.last for s in plan.steps if s.first and not s.what.startswith("the search")), default=1)


def _trials_that_fit(plan: NightPlan, visits: int | None = None) -> int:
    """The most trials the limit holds beside the confirmation at ``visits`` (default ``max_visits``), the
    cold first start and the arms' one-off costs counted (at most ``plan.trials``)."""
    visits = plan.max_visits if visits is None else visits
    room = (plan.limit_s or 0.0) - plan.confirmation_s(visits) - plan._extras_before(plan.trials + 1)
    return min(plan.trials, int(room // plan.trial_s) * plan.parallel) if room > 0 else 0


def _options(spec: SweepSpec, plan: NightPlan) -> list[tuple[str, dict[str, dict]]]:
    """Single changes that shorten the night: benchmark levels, prompts, repetitions, contenders."""
    bench, confirmation = spec.benchmark, spec.confirmation
    options: list[tuple[str, dict[str, dict]]] = []
    if len(bench.concurrency) > 1:
        for level in bench.concurrency:
            if level != spec.objective_concurrency:
                kept = [c for c in bench.concurrency if c != level]
                options.append((f"benchmark.concurrency {bench.concurrency} -> {kept}", {"benchmark": {"concurrency": kept}}))
    if bench.num_prompts >= 16:
        options.append((f"benchmark.num_prompts {bench.num_prompts} -> {bench.num_prompts // 2}",
                        {"benchmark": {"num_prompts": bench.num_prompts // 2}}))
    if bench.repetitions > MIN_VALUES:
        changes = {"repetitions": MIN_VALUES}
        if bench.min_repetitions is not None and bench.min_repetitions > MIN_VALUES:
            changes["min_repetitions"] = MIN_VALUES
        options.append((f"benchmark.repetitions {bench.repetitions} -> {MIN_VALUES}", {"benchmark": changes}))
    if plan.contenders and confirmation.top_k > 1:
        options.append((f"confirmation.top_k {confirmation.top_k} -> 1", {"confirmation": {"top_k": 1}}))
    if plan.contenders and confirmation.no_speculation:
        options.append(("confirmation.no_speculation true -> false", {"confirmation": {"no_speculation": False}}))
    return options


def _visits_that_fit(plan: NightPlan) -> int:
    """The most visits per contender the limit holds after the whole search (0: none)."""
    if not plan.contenders or plan.limit_s is None:
        return 0
    room = plan.limit_s - plan.search_s()
    return int(room // (plan.contenders * plan.visit_s)) if room > 0 else 0


def changes_to_fit(spec: SweepSpec, records: Iterable[TrialRecord] = ()) -> list[str]:
    """What to change so the plan fits ``budget.time_limit_s``: only changes that fit once re-planned, never
    one still over. Each single setting that alone fits (the biggest saving first): fewer trials (the most
    that fit beside the confirmation), fewer visits (the most that fit after the search), both (the least
    visits that decide, ``min_visits``, and the trials that fit beside them), fewer levels, prompts,
    repetitions or contenders. Where none does, the biggest savers together, then the trials and visits
    that fit beside them; where even that does not fit, the limit the night needs. Empty where the plan
    fits or has no limit."""
    records = list(records)
    plan = night_plan(spec, records)
    if plan.fits:
        return []
    fewest = _fewest_trials(plan)
    cuts = _cuts(spec, plan, fewest)
    planned = [(text, changes, _replanned(spec, records, changes)[1]) for text, changes in [*_options(spec, plan), *cuts]]
    out = [f"{text}: saves {format_duration(plan.total_s - changed.total_s)}, ends at {_clock(changed.total_s)} "
           "(fits)" for text, _, changed in sorted(planned, key=lambda o: o[2].total_s) if changed.fits]
    if out:
        return out
    together: dict[str, dict] = {}
    texts: list[str] = []
    combined = plan
    for text, changes, changed in sorted(planned[:len(planned) - len(cuts)], key=lambda o: o[2].total_s):
        clashes = any(key in together.get(section, {}) for section, values in changes.items() for key in values)
        if changed.total_s >= plan.total_s or clashes:
            continue
        together, _ = _merge(together, changes), texts.append(text)
        combined = _replanned(spec, records, together)[1]
        if combined.fits:
            break
        for cut_text, cut in _cuts(spec, combined, fewest):
            trial = _replanned(spec, records, _merge(together, cut))[1]
            if trial.fits:
                return [f"together: {'; '.join([*texts, cut_text])}: ends at {_clock(trial.total_s)} (fits)"]
    if texts and combined.fits:
        return [f"together: {'; '.join(texts)}: ends at {_clock(combined.total_s)} (fits)"]
    least = max(2, min(spec.confirmation.min_visits, plan.max_visits)) if plan.contenders else plan.max_visits
    smallest_changes = _merge(together, {"budget": {"num_trials": fewest},
                                         "confirmation": {"max_visits": least, "min_visits": least}})
    smallest = _replanned(spec, records, smallest_changes)[1]
    texts = [*texts, f"budget.num_trials {plan.trials} -> {fewest} (the opening alone)",
             f"confirmation.max_visits {plan.max_visits} -> {least}"]
    return [f"no cut fits budget.time_limit_s: the least night ({'; '.join(texts)}) ends at "
            f"{_clock(smallest.total_s)}; raise budget.time_limit_s to at least {_clock(smallest.total_s)}"]


def _cuts(spec: SweepSpec, plan: NightPlan, fewest: int) -> list[tuple[str, dict[str, dict]]]:
    """Fewer trials, fewer visits, or both, each the most that fit ``plan``'s limit (none below the opening's
    trials, ``fewest``, or below two visits: a verdict needs two pairs)."""
    out: list[tuple[str, dict[str, dict]]] = []
    trials = _trials_that_fit(plan)
    if fewest <= trials < plan.trials:
        out.append((f"budget.num_trials {plan.trials} -> {trials}", {"budget": {"num_trials": trials}}))
    if not plan.contenders:
        return out
    least = max(2, min(spec.confirmation.min_visits, plan.max_visits))
    visits = _visits_that_fit(plan)
    if least <= visits < plan.max_visits:
        out.append((f"confirmation.max_visits {plan.max_visits} -> {visits}", {"confirmation": {
            "max_visits": visits, "min_visits": min(spec.confirmation.min_visits, visits)}}))
    both = _trials_that_fit(plan, least)
    if fewest <= both < plan.trials and least < plan.max_visits:
        out.append((f"budget.num_trials {plan.trials} -> {both} and confirmation.max_visits {plan.max_visits} -> "
                    f"{least}", {"budget": {"num_trials": both},
                                 "confirmation": {"max_visits": least, "min_visits": least}}))
    return out
def _claims(diffs, spec: SweepSpec, margin: float):
    """Per path (row of per-visit log ratios), whether the confirmation's verdict is decided by its last look
    and whether it says better: ``sequential.judge``'s rule at each look, vectorised (the test checks the two
    agree)."""
    import numpy as np

    from orchestrator.sequential import critical_value
    from orchestrator.sweep.confirmation.extension import spec_design

    design = spec_design(spec)  # the main design the sweep judges by (alpha held in reserve for extensions)
    bound = math.log1p(margin)
    decided = np.zeros(diffs.shape[0], dtype=bool)
    better = np.zeros(diffs.shape[0], dtype=bool)
    for n in range(max(2, design[0].first), design[-1].last + 1):
        critical = critical_value(n, design=design, comparisons=spec.confirmation.top_k)
        if not math.isfinite(critical):
            continue
        sample = diffs[:, :n]
        mean = sample.mean(axis=1)
        half = critical * sample.std(axis=1, ddof=1) / math.sqrt(n)
        low, high = mean - half, mean + half
        says_better = ~decided & (low > 0.0)
        better |= says_better
        decided |= (low > 0.0) | (high < -bound) | ((low > -bound) & (high < bound))
    return decided, better


def _draws(spec: SweepSpec, *, visit_cv: float, gain: float, paths: int, seed: int):
    """Per-visit log ratios of the leader over SGLang's default: each visit a fresh engine of each, so the
    pair's log ratio spreads by ``sqrt(2) x visit_cv``."""
    import numpy as np

    from orchestrator.sweep.confirmation.extension import spec_design

    last = spec_design(spec)[-1].last
    return np.random.default_rng(seed).normal(math.log1p(gain), math.sqrt(2.0) * visit_cv, size=(paths, last))


def decision_chance(spec: SweepSpec, *, visit_cv: float, gain: float, margin: float,
                    paths: int = DECISION_PATHS, seed: int = 0, better_only: bool = False) -> float:
    """Chance that the confirmation's verdict (its leader against SGLang's default) is decided by
    ``max_visits`` (``better_only``: decided *better*) when the true ratio is ``1 + gain`` and a fresh
    engine's level spreads by ``visit_cv`` (sd of its log), by the sweep's own sequential test (its main
    design, ``extension.spec_design``; ``sequential.judge``'s claims) at the leader's correction for
    ``top_k``; seeded simulation of ``paths`` confirmations."""
    decided, better = _claims(_draws(spec, visit_cv=visit_cv, gain=gain, paths=paths, seed=seed), spec, margin)
    return float((better if better_only else decided).mean())


UNDECIDED_MORNING = ("an undecided verdict keeps SGLang's default in best.yaml: the night's search is not acted on "
                     "(a better pick that is not shown better is left unused)")
"""What an undecided morning means, in one sentence (the plan says it beside the decision chance)."""


def decision_spreads(spec: SweepSpec, measured=None):
    """The between-visit spreads the decision chance is stated at, each a ``margin.Figure``: ``measured``
    (this spec's previous sweep, where given), the engine kind's prior, spectune's own GPU figures
    (``margin.GPU_FIGURES``) and :data:`STATED_VISIT_CVS` (assumed: plausible spreads between them), one
    per value."""
    from orchestrator.sweep.confirmation.margin import GPU_FIGURES, Figure, visit_cv_prior, visit_noise_key

    key = visit_noise_key(spec)
    prior = visit_cv_prior(key)
    figures = [measured] if measured is not None else []
    figures += [Figure(prior.value, prior.kind, f"the {key} prior, {prior.source}")]
    figures += [Figure(f.value, f.kind, f"{what}, {f.source}") for what, f in GPU_FIGURES]
    figures += [Figure(cv, "assumed", "a plausible spread between the figures above") for cv in STATED_VISIT_CVS]
    out: dict[float, Figure] = {}
    for figure in figures:
        out.setdefault(round(figure.value, 4), figure)
    return [out[value] for value in sorted(out)]


def decision_lines(spec: SweepSpec, *, measured=None, paths: int | None = None) -> list[str]:
    """The chance of a decided verdict across plausible between-visit spreads (:func:`decision_spreads`, each
    labelled measured or assumed, with its source), for a pick no different from SGLang's default and one
    the margin better (decided, and how often "better"), and what an undecided morning means.

    Args:
        measured: The between-visit spread a previous sweep of this spec measured (a ``margin.Figure``).
        paths: Simulated confirmations per figure (default :data:`DECISION_PATHS`)."""
    paths = DECISION_PATHS if paths is None else paths
    from orchestrator.sweep.confirmation.margin import confirmation_margin

    if not spec.confirmation.enabled or spec.engine.speculative_algorithm is None:
        return []
    margin = confirmation_margin(spec)
    source = "the spec's confirmation.margin" if spec.confirmation.margin != "auto" else \
        "confirmation.margin auto, from the engine kind's prior"
    lines = [f"chance of a decided verdict by {spec.confirmation.max_visits} visits (margin {margin:.1%}, {source}; "
             "simulated through the sweep's own sequential test):"]
    for figure in decision_spreads(spec, measured):
        cv = figure.value
        better = decision_chance(spec, visit_cv=cv, gain=margin, margin=margin, better_only=True, paths=paths)
        same = decision_chance(spec, visit_cv=cv, gain=0.0, margin=margin, paths=paths)
        lines.append(f"  at a between-visit spread of {cv:.1%} ({figure.label()}): \"better\" in {better:.0%} of "
                     f"nights if the pick is {margin:.1%} better than SGLang's default; decided in {same:.0%} if it "
                     "is no different")
    lines.append(f"  {UNDECIDED_MORNING}")
    return lines


A_NIGHT_S = 8 * 3600.0
"""What ``spectune validate`` calls a night where the spec sets no ``budget.time_limit_s`` (the shipped
Kimi specs' limit): a plan longer than this gets a warning."""


def fit_warning(spec: SweepSpec, records: Iterable[TrialRecord] = ()) -> str | None:
    """One line where the night does not fit ``budget.time_limit_s`` (what ``spectune validate`` says), else
    None: the plan's end, what the running sweep would cut, and where the cuts that fit are offered.
    Without a limit: one line where the plan is longer than :data:`A_NIGHT_S`."""
    plan = night_plan(spec, records)
    if plan.limit_s is None:
        if plan.total_s <= A_NIGHT_S:
            return None
        return (f"no budget.time_limit_s bounds the night, and it plans {format_duration(plan.total_s)} at max_visits "
                f"with a {format_duration(plan.start_s)} start ({plan.start_basis.split(':')[0].split(',')[0]}), "
                f"longer than a night ({format_duration(A_NIGHT_S)}): set budget.time_limit_s (the search then stops "
                "in time for the confirmation) or cut budget.num_trials / confirmation.max_visits")
    if plan.fits:
        return None
    return (f"the night does not fit budget.time_limit_s ({format_duration(plan.limit_s)}): it plans "
            f"{format_duration(plan.total_s)} at max_visits with a {format_duration(plan.start_s)} start "
            f"({plan.start_basis.split(':')[0].split(',')[0]}); {plan.cut_line()}; `spectune sweep --dry-run` offers "
            "cuts that fit")
