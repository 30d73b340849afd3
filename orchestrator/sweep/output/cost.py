"""A sweep's cost counted in engine starts: how many, and how long one takes.

* **Starts**: the trials plus, with the confirmation on, at most ``contenders x
  confirmation.max_visits`` visits (:func:`planned_starts`).
* **Start time**: the median launch-to-healthy time of the trials' *warm* starts so far, else of
  their cold ones, else ``budget.engine_start_estimate_s``, else the engine kind's default
  (:func:`start_time`). A node's first start in a sweep is cold (:func:`cold_starts`: page cache
  and JIT caches empty, often much slower); every later start on it is warm, and a plan that took
  the cold start as the norm would overstate the night.
* **First-start extras**: an arm whose first start does one-off work on top, counted once
  (:func:`first_start_extras`): FlashInfer's PCIe-IPC all-reduce tunes its tactics at its first start.
* **A trial** (:func:`trial_cost`): the one estimate the plan, the re-plan, the budget and the limits read:
  the warm start, the run and teardown (``TrialTimings``, whose total is derived: nothing counts it twice),
  and the cold first start's extra. Each figure's basis says measured (where, when), assumed (from what)
  or the spec's.

docs/design/sweep.md says why starts are the unit.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Iterable

import math

from orchestrator.spec import DEFAULT_ENGINE_START_S, DEFAULT_TPOT_MS, SweepSpec
from orchestrator.sweep.records.results import TrialRecord

__all__ = [
    "COLD_START_FACTOR",
    "PCIE_IPC_FIRST_START_S",
    "PlannedStarts",
    "TrialCost",
    "benchmark_estimate_s",
    "cold_starts",
    "cost_line",
    "first_start_extras",
    "format_duration",
    "measured_start_times",
    "planned_starts",
    "repetition_estimate_s",
    "measured_where",
    "start_time",
    "tpot_estimate_s",
    "trial_cost",
    "visit_estimate_s",
    "warm_and_cold_starts",
]


PCIE_IPC_FIRST_START_S = 180.0
"""Extra seconds of the sweep's first engine start on the ``pcie_ipc`` arm: an assumption, not a
measurement. SGLang builds FlashInfer's PCIe-IPC workspace in warm-up and tunes its launch tactics
there, then persists them per world size (``sglang/srt/distributed/device_communicators/pcie_ipc_ar.py``
``_tune_cache_path`` l.166-178, ``_tune`` l.322-328: "only the first server pays"); FlashInfer builds
the kernels' module on first use too. Three minutes allows for that build and for timing the
candidate tactics at up to eleven row counts; the trials' measured starts replace it."""


def first_start_extras(spec: SweepSpec, records: Iterable[TrialRecord] = ()) -> dict[str, tuple[float, str]]:
    """Arm -> (extra seconds, why) of its first start: ``pcie_ipc`` where the sweep measures it as its
    own kernel on the spec's node (or the node is not known yet) and no trial has started it yet."""
    if any(r.params.get("all_reduce") == "pcie_ipc" and r.timings_s.engine_start for r in records):
        return {}
    plan = spec.arms_on_node()
    if "pcie_ipc" not in plan.measured:
        return {}
    path = plan.paths.get("pcie_ipc")
    if path is not None and path.kernel != "pcie_ipc":
        return {}
    return {"pcie_ipc": (PCIE_IPC_FIRST_START_S, "assumed: SGLang tunes PCIe-IPC's tactics once per world size and "
                         "caches them; cost.PCIE_IPC_FIRST_START_S")}


@dataclass(frozen=True)
class PlannedStarts:
    """The engine starts a sweep plans: its trials and, at most, its confirmation visits.

    Attributes:
        trials: ``budget.num_trials``.
        contenders: Configurations the confirmation would visit (0: it is off or cannot run).
        max_visits: Visits per contender at most (``confirmation.max_visits``).
    """

    trials: int
    contenders: int
    max_visits: int

    @property
    def visits(self) -> int:
        """The most confirmation visits: contenders x max_visits."""
        return self.contenders * self.max_visits

    @property
    def total(self) -> int:
        """Every engine start the plan may take."""
        return self.trials + self.visits


def planned_starts(spec: SweepSpec, *, contenders: int | None = None) -> PlannedStarts:
    """The spec's trials and the upper bound of its confirmation visits.

    Args:
        contenders: The confirmation's actual contenders, once known; default: the most the spec
            allows (the ``confirmation.top_k`` best search trials, SGLang's default and, unless
            ``confirmation.no_speculation`` is false, no speculation; none without speculation).
    """
    confirmation = spec.confirmation
    if contenders is None:
        contenders = 0
        if confirmation.enabled and spec.engine.speculative_algorithm is not None:
            baselines = 2  # no speculation and SGLang's default (``DefineByRunSpace.baselines``)
            visited = 1 + int(confirmation.no_speculation)  # SGLang's default, and no speculation unless switched off
            contenders = min(confirmation.top_k, max(0, spec.budget.num_trials - baselines)) + visited
    if not confirmation.enabled:
        contenders = 0
    return PlannedStarts(trials=spec.budget.num_trials, contenders=contenders, max_visits=confirmation.max_visits)


def measured_start_times(records: Iterable[TrialRecord]) -> list[float]:
    """Launch-to-healthy seconds of the trials whose engine came up (a node recorded: the start
    returned); a launch that failed early says nothing about how long a start takes."""
    return [float(r.timings_s.engine_start) for r in records
            if r.timings_s.engine_start is not None and r.node_id is not None and r.timings_s.engine_start > 0]


def _nodes_of(record: TrialRecord) -> set[str]:
    nodes = {str(n["node_id"]) for n in record.engine_nodes if n.get("node_id")}
    return nodes or ({record.node_id} if record.node_id else set())


def cold_starts(records: Iterable[TrialRecord]) -> set[str]:
    """Trial ids whose engine was the first of the sweep on one of its nodes (in order of
    ``started_at``): a cold start. Trials whose engine never came up are neither."""
    seen: set[str] = set()
    cold: set[str] = set()
    started = sorted((r for r in records if r.started_at and measured_start_times([r])), key=lambda r: r.started_at)
    for record in started:
        nodes = _nodes_of(record)
        if nodes - seen:
            cold.add(record.trial_id)
        seen |= nodes
    return cold


def _phase_split(records: Iterable[TrialRecord]) -> str:
    """``: weights 6m00s, CUDA graphs 1m10s, other 2m50s`` (each phase's median over the starts whose
    log gave them: ``TrialRecord.start_phases_s``), or nothing."""
    phases = [r.start_phases_s for r in records if r.start_phases_s]
    if not phases:
        return ""
    names = (("weights", "weights"), ("cuda_graphs", "CUDA graphs"), ("other", "other"))
    parts = [f"{shown} {format_duration(statistics.median(p[name] for p in phases if name in p))}"
             for name, shown in names if any(name in p for p in phases)]
    return ": " + ", ".join(parts)


def measured_where(records: Iterable[TrialRecord]) -> str:
    """Where and when ``records`` ran, for a measured figure's label: ``node 10.0.0.5, 2026-12-05``."""
    records = list(records)
    nodes = sorted({r.node_ip or r.node_id for r in records if r.node_ip or r.node_id})
    days = sorted({r.started_at[:10] for r in records if r.started_at})
    where = f"node{'s' * (len(nodes) > 1)} {', '.join(nodes[:3])}{' ...' * (len(nodes) > 3)}" if nodes else "this sweep"
    when = days[0] if len(days) <= 1 else f"{days[0]} to {days[-1]}"
    return f"{where}, {when}" if when else where


def warm_and_cold_starts(records: Iterable[TrialRecord]) -> tuple[set[str], list[float], list[float]]:
    """The cold first starts' trial ids (:func:`cold_starts`), the warm start times and the cold ones
    (:func:`measured_start_times` of each group)."""
    records = list(records)
    cold_ids = cold_starts(records)
    warm = measured_start_times(r for r in records if r.trial_id not in cold_ids)
    cold = measured_start_times(r for r in records if r.trial_id in cold_ids)
    return cold_ids, warm, cold


def start_time(spec: SweepSpec, records: Iterable[TrialRecord] = ()) -> tuple[float, str]:
    """Seconds per engine start and where the figure comes from, in words: the median of the warm
    ``measured_start_times`` (the cold first starts named beside it), else of the cold ones, else
    ``budget.engine_start_estimate_s`` (the spec's), else the engine kind's default (assumed)."""
    records = list(records)
    cold_ids, warm, cold = warm_and_cold_starts(records)
    started = [r for r in records if measured_start_times([r])]
    if warm:
        first = (f"; the cold first start{'s' * (len(cold) > 1)} took {format_duration(max(cold))}"
                 if cold and max(cold) > 1.2 * statistics.median(warm) else "")
        split = _phase_split(r for r in records if r.trial_id not in cold_ids)
        return statistics.median(warm), (f"measured, median of {len(warm)} warm start{'s' * (len(warm) > 1)} "
                                         f"({measured_where(started)}){split}{first}")
    measured = cold
    if measured:
        return statistics.median(measured), (f"measured, median of {len(measured)} cold first start"
                                             f"{'s' * (len(measured) > 1)} ({measured_where(started)}): later "
                                             "ones are often faster")
    if spec.budget.engine_start_estimate_s is not None:
        return spec.budget.engine_start_estimate_s, "the spec's budget.engine_start_estimate_s"
    return DEFAULT_ENGINE_START_S[spec.engine.kind], (
        f"assumed: the default for {spec.engine.kind} (spec.DEFAULT_ENGINE_START_S); budget.engine_start_estimate_s "
        "sets it")


COLD_START_FACTOR = 2.0
"""A node's cold first start (page cache and JIT caches empty) as a multiple of a warm one, until one is
measured: an assumption, from docs/sweep.md's example (21m00s cold beside 9m55s warm), not a measurement."""


@dataclass(frozen=True)
class TrialCost:
    """What one trial costs: the one estimate the plan, the budget, the limits and the re-plan read.

    Attributes:
        start_s, start_basis: One (warm) engine start, and where the figure comes from (:func:`start_time`).
        run_s: On the engine after its start, the teardown excluded (``TrialTimings.run``: contract, probe,
            benchmark, the rest).
        teardown_s: Stopping the engine.
        run_basis: Where ``run_s`` and ``teardown_s`` come from.
        cold_extra_s, cold_basis: What the sweep's first start on a node adds once, and why.
    """

    start_s: float
    start_basis: str
    run_s: float
    teardown_s: float
    run_basis: str
    cold_extra_s: float
    cold_basis: str

    @property
    def after_start_s(self) -> float:
        """The trial past its start: its run and its teardown."""
        return self.run_s + self.teardown_s

    @property
    def total_s(self) -> float:
        """One warm trial, start to teardown."""
        return self.start_s + self.run_s + self.teardown_s


def trial_cost(spec: SweepSpec, records: Iterable[TrialRecord] = ()) -> TrialCost:
    """One trial's cost: the warm start (:func:`start_time`); the run and teardown, the medians of the
    trials that ended ``ok`` with a measured start (``TrialTimings.run``, ``.teardown``), else the spec's
    benchmark at the per-token estimate (:func:`benchmark_estimate_s`, no teardown counted); the cold first
    start's extra, measured (the slowest cold start less the warm median) or :data:`COLD_START_FACTOR`."""
    records = list(records)
    start_s, start_basis = start_time(spec, records)
    done = [r for r in records if r.status == "ok" and measured_start_times([r])]
    if done:
        run_s = statistics.median(r.timings_s.run for r in done)
        teardowns = [r.timings_s.teardown for r in done if r.timings_s.teardown is not None]
        teardown_s = statistics.median(teardowns) if teardowns else 0.0
        run_basis = (f"measured, median of {len(done)} trial{'s' * (len(done) > 1)} ({measured_where(done)})"
                     + ("" if teardowns else "; teardown not timed"))
    else:
        bench, probe = spec.benchmark, spec.probe
        _, tpot = tpot_estimate_s(spec)
        run_s, teardown_s = benchmark_estimate_s(spec), 0.0
        source = "the spec's" if spec.budget.tpot_estimate_ms is not None else "assumed"
        run_basis = (f"{source}: probe ({probe.num_prompts} x {probe.max_new_tokens} tokens) + "
                     f"{len(bench.concurrency)} level{'s' * (len(bench.concurrency) > 1)} x "
                     f"{bench.repetition_bounds()[1]} repetitions of {bench.num_prompts} x {bench.output_len} tokens "
                     f"at {tpot}")
    cold_ids, warm, cold = warm_and_cold_starts(records)
    if cold and warm:
        cold_extra_s = max(0.0, max(cold) - statistics.median(warm))
        cold_basis = (f"measured: the cold first start took {format_duration(max(cold))} "
                      f"({measured_where(r for r in records if r.trial_id in cold_ids)})")
    elif cold:
        cold_extra_s, cold_basis = 0.0, "the start figure is the measured cold one"
    else:
        cold_extra_s = (COLD_START_FACTOR - 1.0) * start_s
        cold_basis = (f"assumed: a cold start takes {COLD_START_FACTOR:g}x a warm one (cost.COLD_START_FACTOR, "
                      "docs/sweep.md's example: 21m00s cold beside 9m55s warm)")
    return TrialCost(start_s=start_s, start_basis=start_basis, run_s=run_s, teardown_s=teardown_s,
                     run_basis=run_basis, cold_extra_s=cold_extra_s, cold_basis=cold_basis)


def tpot_estimate_s(spec: SweepSpec) -> tuple[float, str]:
    """Seconds per output token of one request before anything is measured, and where it comes from."""
    if spec.budget.tpot_estimate_ms is not None:
        return spec.budget.tpot_estimate_ms / 1000, f"{spec.budget.tpot_estimate_ms:g} ms per token (budget.tpot_estimate_ms)"
    ms = DEFAULT_TPOT_MS[spec.engine.kind]
    return ms / 1000, f"{ms:g} ms per token, the default for {spec.engine.kind} (budget.tpot_estimate_ms sets it)"


def repetition_estimate_s(spec: SweepSpec, concurrency: int) -> float:
    """Seconds one measured repetition at ``concurrency`` is expected to take before anything is measured:
    ``ceil(num_prompts / concurrency)`` waves of ``output_len`` tokens at :func:`tpot_estimate_s`, at least
    ``benchmark.min_repetition_s``."""
    bench = spec.benchmark
    tpot, _ = tpot_estimate_s(spec)
    return max(bench.min_repetition_s, math.ceil(bench.num_prompts / concurrency) * bench.output_len * tpot)


def benchmark_estimate_s(spec: SweepSpec) -> float:
    """Seconds a trial spends after its engine is up, before anything is measured: the correctness probe
    (one request at a time) and, per concurrency level, its warm-up requests and the most repetitions
    (``benchmark.repetitions``: the plan does not count on ``target_ci_rel`` stopping early)."""
    bench, probe = spec.benchmark, spec.probe
    tpot, _ = tpot_estimate_s(spec)
    total = probe.num_prompts * probe.max_new_tokens * tpot
    for concurrency in bench.concurrency:
        total += math.ceil(bench.warmup_requests / concurrency) * bench.output_len * tpot
        total += bench.repetition_bounds()[1] * repetition_estimate_s(spec, concurrency)
    return total


def _repetition_s(spec: SweepSpec, records: list[TrialRecord]) -> float:
    """Benchmark seconds per measured repetition (warm-up included), the trials' median; before any,
    the estimate at the objective's level (:func:`repetition_estimate_s`)."""
    paces = []
    for record in records:
        repetitions = sum(len(v) for v in record.level_values.values())
        if repetitions and record.timings_s.bench:
            paces.append(record.timings_s.bench / repetitions)
    if paces:
        return statistics.median(paces)
    return repetition_estimate_s(spec, spec.objective_concurrency)


def visit_estimate_s(spec: SweepSpec, records: Iterable[TrialRecord] = ()) -> float:
    """Seconds one confirmation visit is expected to take: a start, a teardown and
    ``confirmation.repetitions_per_visit`` repetitions at the trials' pace (``auto``: the visit
    economy's first choice)."""
    records = list(records)
    start, _ = start_time(spec, records)
    teardowns = [r.timings_s.teardown for r in records if r.timings_s.teardown is not None]
    teardown = statistics.median(teardowns) if teardowns else 0.0
    repetition = _repetition_s(spec, records)
    repetitions = spec.confirmation.repetitions_per_visit
    if repetitions == "auto":
        from orchestrator.sweep.confirmation.economy import choose_repetitions

        repetitions = choose_repetitions(within=1.0, between=1.0, start_s=start + teardown, repetition_s=repetition)
    return start + teardown + int(repetitions) * repetition


def format_duration(seconds: float) -> str:
    """``42s``, ``7m05s``, ``3h20m``."""
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def cost_line(spec: SweepSpec, records: Iterable[TrialRecord] = (), *, contenders: int | None = None,
              fits: bool = True) -> str:
    """The plan's cost in one line: ``engine starts (trials + visits) x start time = total``; ``fits``
    False (``night_plan(...).fits``, which the caller knows) adds that the night does not fit its limit."""
    records = list(records)
    plan = planned_starts(spec, contenders=contenders)
    seconds, basis = start_time(spec, records)
    if plan.visits:
        visits = f" + up to {plan.visits} confirmation visits: {plan.contenders} contenders x {plan.max_visits}"
    elif spec.confirmation.enabled:
        visits = "; no confirmation visits"
    else:
        visits = "; confirmation off"
    limit = spec.budget.time_limit_s
    cut = (f"; the night does not fit budget.time_limit_s ({format_duration(limit)}): the plan says what it cuts"
           if limit is not None and not fits else "")
    return (f"cost: {plan.total} engine starts ({plan.trials} trials{visits}) x {format_duration(seconds)} per "
            f"start ({basis}) = ~{format_duration(plan.total * seconds)} of engine starts{cut}")
