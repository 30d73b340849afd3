"""The night planned up front: the sweep's trials and confirmation as a timeline against
``budget.time_limit_s``, what to change where it does not fit, and the chance that it decides.

A trial costs its engine start plus what runs on the engine: the probe, and per concurrency level the
warm-up and the most repetitions (``cost.benchmark_estimate_s``: requests x ``output_len`` x the
per-token time, ``budget.tpot_estimate_ms`` until a trial has measured it; then the trials' medians).
The timeline follows the searcher's own order (``DefineByRunSpace``): the baselines, SGLang's rules of
thumb, one start per all-reduce path and NCCL setting (each named with the hour it is first started),
then the search; then the confirmation, ``contenders x min_visits..max_visits`` visits at the visit
estimate. An arm whose first start does one-off work (``cost.first_start_extras``: PCIe-IPC's tuning)
adds it once, at the trial that first starts it. The plan *fits* when the search and the confirmation at ``max_visits`` end within the limit.
Where it does not, :func:`changes_to_fit` re-plans the spec with one setting changed at a time and
says what each saves. :func:`decision_chance` simulates the confirmation's sequential test (the
sweep's own boundaries) at a stated between-visit spread.

The running sweep re-plans from what it measures (``execution.time_budget``); this is the promise
made before the night starts. Pure functions of the spec (and records): no I/O.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Iterable

from orchestrator.spec import SweepSpec
from orchestrator.statistics import MIN_VALUES
from orchestrator.sweep.output.cost import (
    benchmark_estimate_s, first_start_extras, format_duration, planned_starts, start_time, tpot_estimate_s,
    visit_estimate_s,
)
from orchestrator.sweep.records.results import TrialRecord

__all__ = ["NightPlan", "PlanStep", "changes_to_fit", "decision_chance", "decision_lines", "night_plan", "plan_lines"]

DECISION_PATHS = 4000
"""Simulated confirmations per :func:`decision_chance` figure (seeded): +-1.6% at a chance of 50%."""

STATED_VISIT_CVS = (0.01, 0.02)
"""Between-visit spreads the plan's decision chance is also stated at: ~1-2% was measured between fresh
engines with decode in CUDA graphs on one H200 (docs/measurements/gpu-replication-h200x1-graphs)."""


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

    @property
    def trial_s(self) -> float:
        return self.start_s + self.bench_s

    def _extras_before(self, number: int) -> float:
        return sum(seconds for at, seconds, _ in self.extras if at < number)

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
        return max(0, int(left // self.trial_s) * self.parallel) if left > 0 else 0


def _bench_s(spec: SweepSpec, records: list[TrialRecord]) -> tuple[float, str]:
    """What runs on a trial's engine after its start: the trials' median, else the spec's estimate."""
    measured = [sum(v for k, v in r.timings_s.items() if k != "engine_start")
                for r in records if r.timings_s.get("engine_start") and r.status == "ok"]
    if measured:
        return statistics.median(measured), f"measured, median of {len(measured)} trial{'s' * (len(measured) > 1)}"
    _, tpot = tpot_estimate_s(spec)
    bench = spec.benchmark
    return benchmark_estimate_s(spec), (
        f"estimated: probe + {len(bench.concurrency)} level{'s' * (len(bench.concurrency) > 1)} x "
        f"{bench.repetition_bounds()[1]} repetitions of {bench.num_prompts} x {bench.output_len} tokens at {tpot}")


def night_plan(spec: SweepSpec, records: Iterable[TrialRecord] = ()) -> NightPlan:
    """The plan of ``spec``'s sweep, from ``records`` where trials have ended (else the spec's estimates)."""
    from orchestrator.space.define_by_run import DefineByRunSpace

    records = list(records)
    start_s, start_basis = start_time(spec, records)
    bench_s, bench_basis = _bench_s(spec, records)
    starts = planned_starts(spec)
    plan = NightPlan(start_s=start_s, bench_s=bench_s, start_basis=start_basis, bench_basis=bench_basis,
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
    lines = [f"plan: {plan.trials} trials, {plan.parallel} at a time; a trial = a start {at(plan.start_s)} "
             f"({plan.start_basis}) + {at(plan.bench_s)} on the engine ({plan.bench_basis})"]
    lines += [f"  trial {number} adds {at(seconds)} once ({why})" for number, seconds, why in plan.extras]
    for step in plan.steps:
        if step.first == 0:
            low, high = plan.confirmation_s(plan.min_visits), plan.confirmation_s(plan.max_visits)
            lines.append(f"  {_clock(step.at_s):>6}  confirmation: {plan.contenders} contenders x {plan.min_visits}-"
                         f"{plan.max_visits} visits x {at(plan.visit_s)} = {at(low)} to {at(high)}")
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
        lines.append(f"  {end:>6}  end at max_visits: fits budget.time_limit_s ({at(plan.limit_s)})")
    else:
        affordable = plan.affordable_trials()
        lines.append(f"  {end:>6}  end at max_visits: does NOT fit budget.time_limit_s ({at(plan.limit_s)}); the "
                     f"sweep would stop the search after about {affordable} trials and confirm in what is left")
    return lines


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


def _trials_that_fit(plan: NightPlan) -> int:
    """The most trials the limit holds beside the confirmation at ``max_visits``."""
    room = (plan.limit_s or 0.0) - plan.confirmation_s(plan.max_visits) - sum(s for _, s, _ in plan.extras)
    return int(room // plan.trial_s) * plan.parallel if room > 0 else 0


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
    if plan.contenders and plan.max_visits > 6:
        options.append((f"confirmation.max_visits {plan.max_visits} -> 6",
                        {"confirmation": {"max_visits": 6, "min_visits": min(confirmation.min_visits, 6)}}))
    return options


def changes_to_fit(spec: SweepSpec, records: Iterable[TrialRecord] = ()) -> list[str]:
    """What to change so the plan fits ``budget.time_limit_s``: one setting at a time, each with the time it
    saves and whether it alone fits (the biggest saving first), then, where none fits alone, the biggest
    savers together with the trials that fit beside them. Empty where the plan fits or has no limit."""
    records = list(records)
    plan = night_plan(spec, records)
    if plan.fits:
        return []
    fewest = _fewest_trials(plan)
    single = _options(spec, plan)
    trials = _trials_that_fit(plan)
    if fewest <= trials < plan.trials:
        single.append((f"budget.num_trials {plan.trials} -> {trials}", {"budget": {"num_trials": trials}}))
    planned = [(text, changes, _replanned(spec, records, changes)[1]) for text, changes in single]
    out = []
    for text, _, changed in sorted(planned, key=lambda o: o[2].total_s):
        saved = plan.total_s - changed.total_s
        if saved > 0:
            verdict = "fits" if changed.fits else f"still {format_duration(changed.total_s)}"
            out.append(f"{text}: saves {format_duration(saved)} ({verdict})")
    if any(changed.fits for _, _, changed in planned):
        return out
    together: dict[str, dict] = {}
    texts: list[str] = []
    combined = plan
    for text, changes, changed in sorted(planned, key=lambda o: o[2].total_s):
        clashes = any(key in together.get(section, {}) for section, values in changes.items() for key in values)
        if text.startswith("budget.num_trials") or changed.total_s >= plan.total_s or clashes:
            continue
        together, _ = _merge(together, changes), texts.append(text)
        combined = _replanned(spec, records, together)[1]
        if combined.fits:
            break
    if not combined.fits:
        trials = _trials_that_fit(combined)
        if fewest <= trials < combined.trials:
            together = _merge(together, {"budget": {"num_trials": trials}})
            texts.append(f"budget.num_trials {plan.trials} -> {trials}")
            combined = _replanned(spec, records, together)[1]
    if texts:
        verdict = "fits" if combined.fits else f"still {format_duration(combined.total_s)}"
        out.append(f"together: {'; '.join(texts)}: {_clock(combined.total_s)} ({verdict})")
    return out


def decision_chance(spec: SweepSpec, *, visit_cv: float, gain: float, margin: float,
                    paths: int = DECISION_PATHS, seed: int = 0) -> float:
    """Chance that the confirmation's verdict (its leader against SGLang's default) is decided by
    ``max_visits`` when the true ratio is ``1 + gain`` and a fresh engine's level spreads by ``visit_cv``
    (sd of its log), by the sweep's own sequential test (its main design, ``extension.spec_design``) at
    the leader's correction for ``top_k``; seeded simulation of ``paths`` confirmations."""
    import numpy as np

    from orchestrator.sequential import critical_value
    from orchestrator.sweep.confirmation.extension import spec_design

    design = spec_design(spec)  # the main design the sweep judges by (alpha held in reserve for extensions)
    first, last = design[0].first, design[-1].last
    rng = np.random.default_rng(seed)
    diffs = rng.normal(math.log1p(gain), math.sqrt(2.0) * visit_cv, size=(paths, last))
    bound = math.log1p(margin)
    decided = np.zeros(paths, dtype=bool)
    for n in range(first, last + 1):
        critical = critical_value(n, design=design, comparisons=spec.confirmation.top_k)
        if not math.isfinite(critical):
            continue
        sample = diffs[:, :n]
        mean = sample.mean(axis=1)
        half = critical * sample.std(axis=1, ddof=1) / math.sqrt(n)
        low, high = mean - half, mean + half
        decided |= (low > bound) | (high < -bound) | ((low > -bound) & (high < bound))
    return float(decided.mean())


def decision_lines(spec: SweepSpec) -> list[str]:
    """The chance of a decided verdict at the engine kind's measured between-visit spread and at
    :data:`STATED_VISIT_CVS`, for a pick no different from SGLang's default and one twice the margin better."""
    from orchestrator.sweep.confirmation.margin import MEASURED_VISIT_CV, confirmation_margin, visit_noise_key

    if not spec.confirmation.enabled or spec.engine.speculative_algorithm is None:
        return []
    margin = confirmation_margin(spec)
    measured = MEASURED_VISIT_CV[visit_noise_key(spec)]
    parts = []
    for cv in sorted({measured, *STATED_VISIT_CVS}):
        same = decision_chance(spec, visit_cv=cv, gain=0.0, margin=margin)
        better = decision_chance(spec, visit_cv=cv, gain=2 * margin, margin=margin)
        source = "measured for this engine" if cv == measured else "stated"
        parts.append(f"at a between-visit spread of {cv:.1%} ({source}): {better:.0%} if the pick is "
                     f"{2 * margin:.0%} better than SGLang's default, {same:.0%} if it is no different")
    return [f"chance of a decided verdict by {spec.confirmation.max_visits} visits (margin {margin:.1%}): "
            + "; ".join(parts)]
