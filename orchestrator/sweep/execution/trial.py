"""One trial, top to bottom: engine host up -> env audit -> correctness probe -> benchmark -> teardown.

:func:`run_trial` is the Ray Tune function trainable, run in the trial's placement group; the
engine's life is an ``orchestrator.sweep.execution.session.EngineSession``. Every failure ends as a recorded
result with a reason tag (``results.FAILURE_REASONS``) and a final report (``final: True``) the
searcher reads; nothing is retried. The trial's one record (:class:`TrialRecord`) travels with
every ``tune.report``: once the engine is up, once per benchmark repetition (those at the
objective's level are what ASHA stops on), and at the end; the driver's callback hands it to the
writer. The trial itself sends the writer only its start, its artifacts and the correctness
baseline. docs/design/sweep.md says how the variables reach the engine and what an ASHA stop
leaves behind.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray import tune

from orchestrator.bench.metrics import Distribution, RepetitionMetrics, sum_histograms
from orchestrator.bench.probe import ProbeResult, run_probe
from orchestrator.bench.report import BenchResult
from orchestrator.bench.control import SPECULATIVE_FIELDS, post_generate, resolved_speculative, server_info
from orchestrator.bench.runner import run_benchmark
from orchestrator.bench.settings import BenchSettings
from orchestrator.errors import BenchmarkError
from orchestrator.space import BASELINE_AUTO, BASELINE_PLAIN, TrialPlan
from orchestrator.statistics import log_interval
from orchestrator.timestamps import utc_timestamp
from orchestrator.sweep.records.timings import trial_timings
from orchestrator.sweep.records.results import (
    OBJECTIVE_KEY,
    OBJECTIVE_REPETITION_KEY,
    Objective,
    TrialRecord,
    auto_label,
)
from orchestrator.sweep.execution.session import EngineSession, TrialFailure, step_failure
from orchestrator.sweep.execution.start_flags import sweep_start_flags, with_start_flags
from orchestrator.sweep.execution.time_limits import TrialLimits, trial_limits
from orchestrator.sweep.output.cost import format_duration
from orchestrator.spec import SweepSpec
from serving.engine.command import build_command
from serving.engine.contract import check_engine_contract, contract_request
from serving.engine.all_reduce_observed import observe_all_reduce
from serving.engine.config import EngineConfig
from serving.engine.nccl_log import check_nccl_log, nccl_debug_enabled
from serving.engine.start_phases import start_phases
from serving.waiting import wait_until

__all__ = ["TrialContext", "TrialFailure", "engine_config_for", "run_trial"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrialContext:
    """What every trial of a sweep shares (picklable: it crosses to the workers).

    Attributes:
        spec: The sweep's spec, validated.
        coordinator: The coordinator (:class:`~orchestrator.sweep.execution.coordinator.CoordinatorRef`).
        sweep_name: For log lines and the engine log directory.
    """

    spec: SweepSpec
    coordinator: Any
    sweep_name: str


def engine_config_for(spec: SweepSpec, plan: TrialPlan) -> EngineConfig:
    """The engine of ``plan``: the spec's template plus the point (speculation off for the plain baseline)."""
    config = plan.candidate.applied_to(spec.engine.template())
    if plan.kind == BASELINE_PLAIN and config.speculative_algorithm is not None:
        data = config.model_dump()
        data.update(speculative_algorithm=None, speculative_draft_model_path=None, speculative_num_steps=None,
                    speculative_eagle_topk=None, speculative_num_draft_tokens=None)
        config = EngineConfig.model_validate(data)
    return config


@dataclass
class _TrialState:
    """What a trial has learned so far: its record (reported with every ``tune.report``) and the
    benchmark results its figures come from; becomes its final record whatever happens."""

    plan: TrialPlan
    record: TrialRecord
    limits: TrialLimits
    timings: dict[str, float] = field(default_factory=dict)
    objective_values: list[float] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    bench: BenchResult | None = None
    other_levels: BenchResult | None = None
    measured_in_full: bool = False
    repetitions: dict[int, list[RepetitionMetrics]] = field(default_factory=dict)
    """Every measured repetition by concurrency, as it arrives: what an early-stopped trial's record
    (its last report) keeps of its histogram, cycle times and medians."""

    @property
    def trial_id(self) -> str:
        return self.record.trial_id

    @property
    def number(self) -> int:
        return self.record.number

    def learn(self, **fields: Any) -> None:
        """Set fields of the record (what the next report carries)."""
        self.record = self.record.model_copy(update=fields)

    def report(self, **result: Any) -> None:
        """One ``tune.report``: ``result`` and the record so far."""
        tune.report({**result, "record": self.record.model_dump_json()})


def _objective_of(spec: SweepSpec, values: list[float]) -> Objective:
    """The objective's repetitions: their median, and the log-scale 95% interval (none from < 3 values)."""
    import statistics

    interval = log_interval(values)
    return Objective(
        metric=spec.objective.metric, concurrency=spec.objective_concurrency, direction=spec.objective.direction,
        values=values, median=statistics.median(values), ci95_low=interval[0] if interval else None,
        ci95_high=interval[1] if interval else None,
    )


def _slo_violation(spec: SweepSpec, bench: BenchResult | None) -> float | None:
    """max(observed / limit - 1) over the spec's SLO limits at the objective level (> 0: violated)."""
    limits = spec.objective.slo.limits()
    if not limits or bench is None:
        return None
    level = bench.level(spec.objective_concurrency)
    worst = None
    for name, limit in limits.items():
        observed = level.value(name)
        if observed is None:
            continue
        excess = observed / limit - 1.0
        worst = excess if worst is None else max(worst, excess)
    return worst


def _rep_metrics(metrics: RepetitionMetrics) -> dict[str, float | None]:
    return {f"c{metrics.concurrency}.{k}": v for k, v in metrics.flat().items()}


def run_trial(config: dict[str, Any], ctx: TrialContext) -> None:
    """The Ray Tune trainable: one configuration, start to recorded end."""
    spec = ctx.spec
    plan = TrialPlan.from_config(config)
    trial_id = tune.get_context().get_trial_id() or f"local-{os.getpid()}"
    engine_config = engine_config_for(spec, plan)
    start_flags = sweep_start_flags(spec, engine_config)  # run with, recorded apart: never in engine_config
    # port 0 stands for the free port the host picks; the record keeps this form (secrets redacted)
    engine_command = build_command(with_start_flags(engine_config, start_flags), host="127.0.0.1",
                                   port=0).shell(redacted=True)
    writer = ctx.coordinator.get()
    record = TrialRecord(
        trial_id=trial_id, number=0, kind=plan.kind, label=plan.label(), params=_params(plan, spec),  # type: ignore[arg-type]
        status="running", engine_command=engine_command, engine_config=engine_config.model_dump(),
        start_flags=start_flags, repetitions_planned=spec.benchmark.repetitions, started_at=utc_timestamp(),
    )
    started = ray.get(writer.start_trial.remote(record.model_dump()))
    if started["finished"] is not None:  # a resumed sweep re-ran a trial that had ended: report, don't re-run
        tune.report(_final_report(spec, TrialRecord.model_validate(started["finished"])))
        return
    state = _TrialState(plan=plan, record=record.model_copy(update={"number": started["number"],
                                                                   "mlflow_run_id": started["run_id"]}),
                        limits=trial_limits(spec, [TrialRecord.model_validate(r) for r in started["ended"]]))
    logger.info("trial %d (%s): starting %s", state.number, trial_id, plan.label())
    tune.report(_final_report(spec, _run_steps(spec, ctx, state, engine_config)))


def _params(plan: TrialPlan, spec: SweepSpec) -> dict[str, Any]:
    """Every parameter of the trial, each NCCL variable of the space by name ('default' = unset)."""
    params: dict[str, Any] = plan.params()
    for name in spec.search.nccl_variables():
        params[name] = plan.candidate.nccl_env.get(name, "default")
    for name, value in sorted(spec.engine.env.items()):
        params.setdefault(f"env.{name}", value)
    return params


def _final_report(spec: SweepSpec, record: TrialRecord) -> dict[str, Any]:
    """The trial's last ``tune.report``: its record, and what the searcher and ASHA read."""
    report: dict[str, Any] = {
        "final": True, "record": record.model_dump_json(), "status": record.status, "reason": record.reason or "",
        "repetitions_planned": record.repetitions_planned, "node_id": record.node_id or "",
    }
    if record.status in ("ok", "infeasible") and record.value is not None:
        report[OBJECTIVE_KEY] = record.value
    if record.slo_violation is not None:
        report["slo_violation"] = record.slo_violation
    for name, value in (record.resolved_params or {}).items():
        report[f"resolved_{name}"] = value  # the searcher counts SGLang's auto choice as this point
    return report


def _run_steps(spec: SweepSpec, ctx: TrialContext, state: _TrialState, engine_config: EngineConfig) -> TrialRecord:
    """Host -> audit -> probe -> benchmark -> teardown; any failure becomes the record's reason."""
    coordinator = ctx.coordinator.get()
    started = time.monotonic()
    status, reason, message = "ok", None, ""

    def ship_engine_log(text: str) -> None:
        _artifacts(coordinator, state, {"engine.log": text})

    limits = state.limits
    state.learn(time_limits_s={"engine_start": round(limits.start_s, 1), "trial": round(limits.trial_s, 1)})
    if limits.derived:
        logger.info("trial %d (%s): engine start limit %s, trial limit %s (%s)", state.number, state.trial_id,
                    format_duration(limits.start_s), format_duration(limits.trial_s), limits.basis)
    session = EngineSession(
        with_start_flags(engine_config, state.record.start_flags), session_id=state.trial_id, label=f"trial {state.number}",
        sweep_name=ctx.sweep_name,
        placement=spec.trial_placement, start_timeout_s=limits.start_s,
        time_limit_s=limits.trial_s, timings=state.timings, ship_log=ship_engine_log,
    )
    try:
        if state.plan.kind != BASELINE_PLAIN:
            baseline = _wait_for_baseline(coordinator, timeout_s=spec.budget.trial_timeout_s)
        session.open()
        state.learn(start_phases_s=start_phases(session.log_text(), total_s=state.timings.get("engine_start")))
        state.info = session.info
        state.learn(node_id=state.info.get("node_id"), node_ip=state.info.get("node_ip"),
                    cuda_visible_devices=state.info.get("cuda_visible_devices"), engine_nodes=list(session.nodes),
                    audit_ok=session.audit_ok)
        _artifacts(coordinator, state, {"env_audit.json": _json(session.audit)})
        session.check_audit()
        _resolve(spec, state, session, coordinator, engine_config)
        tic = time.monotonic()
        _check_contract(state, session, coordinator, engine_config)
        state.timings["contract"] = time.monotonic() - tic
        state.report()  # the engine is up: where it runs, its audit and what it resolved reach the run
        tic = time.monotonic()
        probed = _probe(spec, state, session, coordinator,
                        baseline=None if state.plan.kind == BASELINE_PLAIN else baseline)
        state.timings["probe"] = time.monotonic() - tic
        if probed.flips:
            message = f"probe: {probed.message}"
        _nccl_log_proof(state, session, coordinator, tp_size=engine_config.tp_size)
        tic = time.monotonic()
        try:
            _benchmark(spec, ctx, state, session)
        finally:
            state.timings["bench"] = time.monotonic() - tic
            if histograms := _accept_histograms(state):
                _artifacts(coordinator, state, {"accept_histograms.json": _json(histograms)})
        violation = _slo_violation(spec, state.bench)
        if violation is not None and violation > 0:
            status, reason = "infeasible", "slo_violated"
            message = f"SLO exceeded by {violation:.1%} at concurrency {spec.objective_concurrency}" + (
                f"; {message}" if message else "")
    except TrialFailure as failure:
        status, reason, message = "failed", failure.reason, failure.message
        if session.timed_out:
            reason = "timeout"
            message = (f"the trial ran past its time limit of {limits.trial_s:g} s ({limits.basis}); {message}"
                       if limits.derived else
                       f"the trial ran past budget.trial_timeout_s={spec.budget.trial_timeout_s:g} s; {message}")
        if state.plan.kind == BASELINE_PLAIN and not _has_baseline(coordinator):
            ray.get(coordinator.baseline_failed.remote(f"{reason}: {message}"[:500]))
    except Exception as exc:  # noqa: BLE001 - a bug must still end as a recorded trial, with the traceback logged
        logger.exception("trial %d (%s): unexpected error", state.number, state.trial_id)
        status, reason, message = "failed", "error", f"{type(exc).__name__}: {exc}"
        if state.plan.kind == BASELINE_PLAIN and not _has_baseline(coordinator):
            ray.get(coordinator.baseline_failed.remote(message[:500]))
    finally:
        session.close()
        if session.teardown_problem and status == "ok":
            status, reason, message = "failed", "stop_failed", session.teardown_problem
    state.timings["wall"] = time.monotonic() - started  # TrialTimings derives ``other`` from it, never a part
    return _final_record(spec, state, status=status, reason=reason, message=message)


def _resolve(spec: SweepSpec, state: _TrialState, session: EngineSession, coordinator: Any,
             engine_config: EngineConfig) -> None:
    """Record what the engine runs with, read from it: decode's all-reduce kernel and the speculative
    numbers (SGLang's auto choice resolved, or a count the engine rewrote, logged)."""
    info = server_info(session.url)
    _all_reduce(spec, state, session, coordinator, info=info, tp_size=engine_config.tp_size)
    if engine_config.speculative_algorithm is None:
        return
    resolved = resolved_speculative(session.url, info=info)
    if resolved is None:
        logger.warning("trial %d (%s): /server_info reports no speculative numbers; the record keeps the requested "
                       "ones", state.number, state.trial_id)
        return
    requested = {"num_steps": engine_config.speculative_num_steps, "eagle_topk": engine_config.speculative_eagle_topk,
                 "num_draft_tokens": engine_config.speculative_num_draft_tokens}
    changed = {k: (v, resolved[k]) for k, v in requested.items() if v is not None and v != resolved[k]}
    if changed:
        logger.warning("trial %d (%s): the engine rewrote %s; recorded as run", state.number, state.trial_id,
                       ", ".join(f"{SPECULATIVE_FIELDS[k]} {a} -> {b}" for k, (a, b) in changed.items()))
    label = auto_label(state.record.label, resolved) if state.plan.kind == BASELINE_AUTO else state.record.label
    state.learn(resolved_params=dict(resolved), label=label)


LOG_HEAD_LINES = 200
"""Lines of the engine's log kept in a contract stop's diagnostic bundle (its start: flags, versions)."""


def _check_contract(state: _TrialState, session: EngineSession, coordinator: Any, engine_config: EngineConfig) -> None:
    """The engine contract (``serving.engine.contract``) on this engine's first answers: one short
    ``/generate`` (with logprobs where it does not speculate), then its ``/server_info`` and its log.
    What only a blind reader uses is warned about and kept in the record (``blind_readers``).

    Raises:
        TrialFailure: ``engine_contract`` when nothing could be measured (no output ids, no
            completion_tokens, no spec_verify_ct under speculation), naming every item missing and
            what the engine sent, with a diagnostic bundle written to the results directory (the
            sweep then stops); ``engine_died`` / ``probe_failed`` where the request itself failed.
    """
    speculative = engine_config.speculative_algorithm is not None
    try:
        reply = post_generate(session.url, contract_request(speculative=speculative), timeout_s=300)
    except BenchmarkError as exc:
        raise step_failure(session, "probe_failed", exc) from None
    info = server_info(session.url)
    log_text = session.log_text() if engine_config.tp_size > 1 else ""
    check = check_engine_contract(
        server_info=info, generate_reply=reply, log_text=log_text,
        speculative=speculative, tp_size=engine_config.tp_size, nccl_info=nccl_debug_enabled(session.expected_env))
    _artifacts(coordinator, state, {"engine_contract.json": _json(check.to_dict())})
    if check.blind:
        state.learn(blind_readers=list(check.blind))
        logger.warning("trial %d (%s): the engine's first answers lack what a blind reader uses (the trial goes on "
                       "without it; the summary flags the night): %s", state.number, state.trial_id,
                       "; ".join(check.blind))
    if not check.ok:
        bundle = {"server_info.json": _json(info), "generate_reply.json": _json(reply),
                  "engine_contract.json": _json(check.to_dict()),
                  "engine-log-head.txt": "\n".join((log_text or session.log_text()).splitlines()[:LOG_HEAD_LINES])
                  + "\n",
                  "engine_command.txt": state.record.engine_command + "\n"}
        folder = ray.get(coordinator.write_diagnostics.remote(name=f"trial-{state.number:03d}-engine-contract",
                                                              files=bundle))
        raise TrialFailure("engine_contract", f"{check.summary()} (what it sent: {folder})")


def _all_reduce(spec: SweepSpec, state: _TrialState, session: EngineSession, coordinator: Any, *,
                info: dict[str, Any] | None, tp_size: int) -> None:
    """Record which kernel decode's all-reduce is on, observed (``serving.engine.all_reduce_observed``),
    never taken from the flags; warn where it is not the kernel the plan predicted for the arm."""
    log_text = session.log_text() if tp_size > 1 else ""
    observed = observe_all_reduce(server_info=info, log_text=log_text, tp_size=tp_size)
    state.learn(all_reduce_kernel=observed.kernel)
    arm = state.plan.candidate.all_reduce
    plan = spec.arms_on_node()
    predicted = plan.paths.get(arm)
    report = {**observed.to_dict(), "arm": arm, "gpu_kind": plan.gpu_kind,
              "predicted": None if predicted is None else predicted.kernel}
    _artifacts(coordinator, state, {"all_reduce.json": _json(report)})
    if predicted is not None and observed.kernel not in ("unknown", predicted.kernel):
        logger.warning("trial %d (%s): all-reduce arm %r was planned as %s on %s, but the engine ran %s (%s); "
                       "recorded as run: check engine.gpu_kind and engine.architecture", state.number, state.trial_id,
                       arm, predicted.kernel, plan.gpu_kind, observed.kernel, observed.evidence)
    else:
        logger.info("trial %d (%s): decode all-reduce on %s (%s)", state.number, state.trial_id, observed.kernel,
                    observed.evidence)


def _has_baseline(coordinator: Any) -> bool:
    return "text" in ray.get(coordinator.get_baseline.remote())


def _wait_for_baseline(coordinator: Any, *, timeout_s: float) -> str:
    """The probe baseline the no-speculation trial writes; waits for it (that trial may still run)."""
    found: dict[str, Any] = {}

    def ready() -> bool:
        found.update(ray.get(coordinator.get_baseline.remote()))
        return bool(found)

    try:
        wait_until(ready, timeout_s=timeout_s, what="the correctness baseline (the no-speculation trial)", poll_s=1.0)
    except TimeoutError as exc:
        raise TrialFailure("no_baseline", str(exc)) from None
    if "failed" in found:
        raise TrialFailure("no_baseline", f"the no-speculation trial could not write the baseline: {found['failed']}")
    return found["text"]


def _probe(spec: SweepSpec, state: _TrialState, session: EngineSession, coordinator: Any, *,
           baseline: str | None) -> ProbeResult:
    """Greedy outputs against the no-speculation baseline (the plain baseline trial writes it); the
    near-tie flips it passed go into the record; a failed probe raises ``probe_mismatch``."""
    url = session.url
    with tempfile.TemporaryDirectory(prefix="spectune-probe-") as tmp:
        path = Path(tmp) / "baseline.json"
        if baseline is not None:
            path.write_text(baseline, encoding="utf-8")
        try:
            result = run_probe(base_url=url, baseline_path=path, create_baseline=baseline is None,
                               num_prompts=spec.probe.num_prompts, max_new_tokens=spec.probe.max_new_tokens,
                               rule=spec.probe.rule, max_logprob_gap=spec.probe.max_logprob_gap,
                               max_flip_rate=spec.probe.max_flip_rate)
        except BenchmarkError as exc:
            raise step_failure(session, "probe_failed", exc) from None
        if baseline is None:
            ray.get(coordinator.put_baseline.remote(path.read_text(encoding="utf-8")))
        _artifacts(coordinator, state, {"probe.json": result.model_dump_json(indent=2)})
    state.learn(probe_flips=list(result.flips))
    if not result.passed:
        raise TrialFailure("probe_mismatch", result.message)
    if result.flips:
        logger.info("trial %d (%s): probe passed with near-tie flips (GPU numerics, not corruption): %s",
                    state.number, state.trial_id, result.message)
    return result


def _nccl_log_proof(state: _TrialState, session: EngineSession, coordinator: Any, *, tp_size: int) -> None:
    """The second per-rank proof: with ``NCCL_DEBUG=INFO`` every rank's logged NCCL variables must be
    the trial's (``serving.engine.nccl_log``); runs after the probe, once every rank has all-reduced.

    Raises:
        TrialFailure: ``nccl_log``, a rank read another value or none.
    """
    expected = session.expected_env
    log_text = session.log_text() if nccl_debug_enabled(expected) and tp_size > 1 else ""
    check = check_nccl_log(log_text, expected, tp_size=tp_size, processes=session.audit.get("processes", ()))
    state.learn(nccl_log=check.status)
    _artifacts(coordinator, state, {"nccl_log.json": _json(check.to_dict())})
    if check.status != "not_applicable":
        (logger.info if check.ok else logger.warning)("trial %d (%s): %s", state.number, state.trial_id, check.summary())
    if not check.ok:
        raise TrialFailure("nccl_log", check.summary())


def _benchmark(spec: SweepSpec, ctx: TrialContext, state: _TrialState, session: EngineSession) -> None:
    """The objective's level first, then the other levels; one ``tune.report`` per repetition
    (with the repetition's metrics; at the objective's level also its value, what ASHA reads)."""
    coordinator = ctx.coordinator.get()
    objective_level = spec.objective_concurrency
    metric = spec.objective.metric
    planned = spec.benchmark.repetitions

    def on_repetition(metrics: RepetitionMetrics) -> None:
        result: dict[str, Any] = {"repetition": metrics.repetition, "repetition_metrics": _rep_metrics(metrics)}
        if _learn_repetition(spec, state, metrics):
            result.update({OBJECTIVE_KEY: metrics.flat().get(metric), OBJECTIVE_REPETITION_KEY: metrics.repetition + 1,
                           "repetitions_planned": planned})
        state.report(**result)

    levels = [objective_level] + [c for c in spec.benchmark.concurrency if c != objective_level]
    for group in ([levels[0]], levels[1:]):
        if not group:
            continue
        try:
            result = run_benchmark(base_url=session.url, settings=BenchSettings.for_sweep(
                spec.benchmark, objective_metric=spec.objective.metric, levels=group),
                                   on_repetition=on_repetition)
        except BenchmarkError as exc:
            partial = getattr(exc, "partial", None)
            if partial is not None:
                _store_bench(state, partial, objective=group[0] == objective_level)
            raise step_failure(session, "bench_failed", exc) from None
        _store_bench(state, result, objective=group[0] == objective_level)
        state.measured_in_full = state.measured_in_full or group[0] == objective_level
    texts = {"benchmark.json": state.bench.model_dump_json(indent=2)} if state.bench else {}
    if state.other_levels is not None:
        texts["benchmark-other-levels.json"] = state.other_levels.model_dump_json(indent=2)
    _artifacts(coordinator, state, texts)


def _learn_repetition(spec: SweepSpec, state: _TrialState, metrics: RepetitionMetrics) -> bool:
    """Keep one measured repetition; at the objective's level (True) the record learns its value and
    what was measured so far (medians, histogram, cycle times): ASHA may stop the trial after this
    report, and the record the sweep then keeps is this one."""
    state.repetitions.setdefault(metrics.concurrency, []).append(metrics)
    level = spec.objective_concurrency
    if metrics.concurrency != level:
        return False
    value = metrics.flat().get(spec.objective.metric)
    if isinstance(value, (int, float)):
        state.objective_values.append(float(value))
        state.learn(objective=_objective_of(spec, state.objective_values), level_values=_level_values(spec, state),
                    metrics={**state.record.metrics, **_medians(level, state.repetitions[level])},
                    accept_histograms=_accept_histograms(state), level_cycle_ms=_level_cycles(spec, state))
    return True


def _store_bench(state: _TrialState, result: BenchResult, *, objective: bool) -> None:
    if objective:
        state.bench = result
    else:
        state.other_levels = result


def _level_values(spec: SweepSpec, state: _TrialState) -> dict[str, list[float]]:
    """The objective metric's per-repetition values at every measured level, keyed by the
    concurrency as a string."""
    out: dict[str, list[float]] = {}
    if state.objective_values:
        out[str(spec.objective_concurrency)] = list(state.objective_values)
    if state.other_levels is not None:
        for level in state.other_levels.levels:
            values = [v for v in (rep.flat().get(spec.objective.metric) for rep in level.repetitions)
                      if isinstance(v, (int, float))]
            if values and level.concurrency != spec.objective_concurrency:
                out[str(level.concurrency)] = [float(v) for v in values]
    return out


def _levels_measured(state: _TrialState) -> dict[int, list[RepetitionMetrics]]:
    """Each measured level's repetitions: the benchmark's results where they came back, else the
    repetitions reported so far (a trial stopped or failed part-way)."""
    out = {concurrency: list(reps) for concurrency, reps in state.repetitions.items()}
    for result in (state.bench, state.other_levels):
        for level in result.levels if result is not None else ():
            out[level.concurrency] = list(level.repetitions)
    return out


def _medians(concurrency: int, repetitions: list[RepetitionMetrics]) -> dict[str, float]:
    """``c{concurrency}.{metric}`` -> the median over ``repetitions`` (present, finite values), the
    summary a finished level's ``BenchResult.flat`` gives (``summarise_level``: ``Distribution.of``)."""
    flats = [rep.flat() for rep in repetitions]
    out: dict[str, float] = {}
    for name in flats[0] if flats else ():
        median = Distribution.of(v for flat in flats if (v := flat.get(name)) is not None and math.isfinite(v)).median
        if median is not None:
            out[f"c{concurrency}.{name}"] = median
    return out


def _level_cycles(spec: SweepSpec, state: _TrialState) -> dict[str, list[float]]:
    """Each measured level's per-repetition cycle_ms beside its objective values, keyed by the
    concurrency as a string; a level where a repetition lacks either is left out (the pairs would not
    line up)."""
    out: dict[str, list[float]] = {}
    for concurrency, repetitions in _levels_measured(state).items():
        pairs = [(rep.flat().get(spec.objective.metric), rep.cycle_ms) for rep in repetitions]
        if pairs and all(isinstance(v, (int, float)) and isinstance(c, (int, float)) and c > 0 for v, c in pairs):
            out[str(concurrency)] = [float(c) for _, c in pairs]
    return out


def _accept_histograms(state: _TrialState) -> dict[str, list[int]]:
    """Each measured level's accepted-draft histogram (its repetitions' summed), keyed by the
    concurrency as a string; empty without speculation."""
    out: dict[str, list[int]] = {}
    for concurrency, repetitions in _levels_measured(state).items():
        histogram = sum_histograms(rep.accept_histogram for rep in repetitions)
        if histogram is not None:
            out[str(concurrency)] = histogram
    return out


def _final_record(spec: SweepSpec, state: _TrialState, *, status: str, reason: str | None,
                  message: str) -> TrialRecord:
    """The trial's record at its end: what it measured and ran on, with its outcome."""
    metrics: dict[str, float] = {}
    for concurrency, repetitions in _levels_measured(state).items():  # the results', else those reported so far
        metrics.update(_medians(concurrency, repetitions))
    state.learn(
        objective=_objective_of(spec, state.objective_values) if state.objective_values else None,
        level_values=_level_values(spec, state), metrics=metrics, slo_violation=_slo_violation(spec, state.bench),
        accept_histograms=_accept_histograms(state), level_cycle_ms=_level_cycles(spec, state),
        measured_in_full=state.measured_in_full, timings_s=trial_timings(state.timings),
    )
    return state.record.ended(status=status, reason=reason, message=message,  # type: ignore[arg-type]
                              ended_at=utc_timestamp())


def _artifacts(coordinator: Any, state: _TrialState, texts: dict[str, str]) -> None:
    """Text artifacts of the trial's MLflow run, through the writer."""
    if texts:
        ray.get(coordinator.log_artifacts.remote(trial_id=state.trial_id, texts=texts))


def _json(data: Any) -> str:
    return json.dumps(data, indent=2, default=str)
