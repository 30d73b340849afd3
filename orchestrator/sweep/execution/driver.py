"""One sweep, top to bottom: ``run_sweep``, what ``spectune sweep`` and ``python -m orchestrator.sweep`` call.

Preflight (``preflight``), the coordinator actor (``cluster``), the Tuner (``search``,
``scheduler``, ``trial``, ``callbacks``), then every trial's record, the confirmation (``visit``)
and the verdict's files (``finish``).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from rich.console import Console
from rich.markup import escape

from orchestrator.space.define_by_run import DefineByRunSpace
from orchestrator.sweep.execution.callbacks import tune_callbacks
from orchestrator.sweep.execution.night_stop import night_stop, night_stopper, probe_words
from orchestrator.sweep.execution.smoke import (
    SMOKE_TRIALS,
    smoke_lines,
    smoke_passed,
    smoke_resumable,
    smoke_spec,
    write_smoke_state,
)
from orchestrator.exit_codes import EXIT_FAILED, EXIT_OK
from orchestrator.sweep.execution.ray_connection import SweepBusyError, connect_ray, create_coordinator
from orchestrator.sweep.output.cost import cost_line
from orchestrator.sweep.output.night_plan import night_plan, plan_lines
from orchestrator.sweep.execution.coordinator import (
    STATE_FILE,
    CoordinatorRef,
    coordinator_name,
)
from orchestrator.sweep.output.display import Display, QuietWatch, job_console
from orchestrator.sweep.execution.finish import SweepOutcome, final_records, finish_sweep
from orchestrator.sweep.execution.time_budget import TimeBudget
from orchestrator.sweep.execution.traffic_setup import pin_dataset, read_traffic
from orchestrator.sweep.execution.sweep_preflight import (
    PreflightError,
    check_engine,
    check_network,
    check_resources,
    check_tracking,
)
from orchestrator.bench.files import write_atomic
from orchestrator.sweep.records.results import TrialRecord
from orchestrator.sweep.records.results_dir import archive_previous, resolve_results_dir
from orchestrator.sweep.search.early_stopping import early_stopping_scheduler
from orchestrator.sweep.search.searcher import SweepSearcher
from orchestrator.sweep.execution.visit import run_cluster_confirmation
from orchestrator.errors import SpectuneError
from orchestrator.spec import SweepSpec
from orchestrator.sweep.output.spec_summary import sweep_params

__all__ = [
    "PreflightError", "SweepBusyError", "SweepOutcome", "SweepResumeError", "run_sweep", "sweep_search",
]

logger = logging.getLogger(__name__)


class SweepResumeError(SpectuneError):
    """``--resume`` named a directory that holds no sweep."""


def resolve_tracking_uri(spec: SweepSpec, out: Path, *, given: str | None, resume: bool,
                         environ: Mapping[str, str] = os.environ) -> tuple[str, str]:
    """The MLflow tracking URI of the sweep in ``out``, and where it came from.

    A resumed sweep's recorded store, else ``--tracking-uri``, the spec's ``tracking.mlflow_uri``,
    ``$MLFLOW_TRACKING_URI``, then a SQLite file in the results directory.

    Raises:
        SweepResumeError: ``--tracking-uri`` names another store than the resumed sweep's.
    """
    state_path = out / STATE_FILE
    if resume and state_path.exists():
        stored = json.loads(state_path.read_text(encoding="utf-8")).get("tracking_uri")
        if stored and given and given != stored:
            raise SweepResumeError(f"--tracking-uri {given}: the sweep in {out} started with {stored}, where its "
                                   "MLflow parent run is; resume it there (leave --tracking-uri out)")
        if stored:
            return stored, "the resumed sweep's store"
    if given:
        return given, "--tracking-uri"
    if spec.tracking.mlflow_uri:
        return spec.mlflow_uri(base=out.parent), "tracking.mlflow_uri"
    if environ.get("MLFLOW_TRACKING_URI"):
        return environ["MLFLOW_TRACKING_URI"], "$MLFLOW_TRACKING_URI"
    return f"sqlite:///{out / 'mlflow.db'}", "the default: a SQLite file in the results directory"


def run_sweep(
    spec: SweepSpec, *, spec_text: str, results_dir: str | None = None, address: str | None = None,
    resume: bool = False, console: Console | None = None, wait_for_resources_s: float = 0.0,
    tracking_uri: str | None = None, extend_to: int | None = None, confirmation_minutes: float | None = None,
    smoke: bool = False, finish: bool = False,
) -> SweepOutcome:
    """Run the whole sweep; returns its outcome (never raises for a failed trial).

    Args:
        tracking_uri: ``--tracking-uri`` (see :func:`resolve_tracking_uri` for the rest).
        extend_to: ``--max-visits`` (with ``resume``): extend the confirmation's design to this many
            looks (``confirm.run_confirmation``); the search is restored as it ended.
        confirmation_minutes: ``--max-minutes``: the confirmation's time in this run.
        smoke: ``--smoke``: the night's two baselines only (``orchestrator.sweep.execution.smoke``);
            ``resume`` of its directory continues into the night without starting them again.
        finish: ``--finish``: end the stopped sweep in ``results_dir`` from what is on disk (its
            spec.yaml, trials.jsonl, confirmation.jsonl): no search trial runs; the confirmation
            runs for ``confirmation_minutes`` where given (none: no confirmation, best.yaml keeps
            SGLang's default and names the search's best as an unconfirmed candidate); then the
            final files.

    Raises:
        PreflightError: the sweep cannot run as specified here (nothing was started or moved).
        EngineContractError: a trial's engine answered nothing a measurement needs; every trial
            was stopped, the morning files and a diagnostic bundle written (``night_stop``).
        SweepResumeError, SweepBusyError: as their names say.
    """
    import ray

    console = console or job_console()
    out = resolve_results_dir(spec.results_dir, results_dir)
    if finish and not (out / STATE_FILE).exists():
        raise SweepResumeError(f"--finish {out}: no sweep to finish there (no {STATE_FILE})")
    resume = resume or finish
    if resume and not (out / STATE_FILE).exists():
        raise SweepResumeError(f"--resume {out}: no sweep to resume there (no {STATE_FILE})")
    if smoke and resume:
        raise SweepResumeError(f"--smoke with --resume {out}: a smoke run starts a results directory; --resume alone "
                               "continues a smoke run into the night")
    after_smoke = resume and smoke_resumable(out)  # the night starts here: the smoke's baselines are taken over
    tracking_uri, tracking_from = resolve_tracking_uri(spec, out, given=tracking_uri, resume=resume)
    console.print(f"spectune sweep {escape(spec.name)}: results in {escape(str(out))}", highlight=False)
    if finish and confirmation_minutes is None:  # nothing will start: no engine, resource or network checks
        console.print(f"preflight: {escape(check_tracking(tracking_uri))}", highlight=False, soft_wrap=True)
        connect_ray(address)
    else:
        spec = _preflight(spec, tracking_uri=tracking_uri, address=address, wait_s=wait_for_resources_s,
                          console=console)
    for warning in spec.warnings():
        console.print(f"warning: {escape(warning)}", highlight=False, soft_wrap=True)
    night_spec = spec
    if smoke:
        spec = smoke_spec(spec)
        console.print(f"smoke run: the night's first {SMOKE_TRIALS} trials (its baselines), one repetition at "
                      f"concurrency {spec.objective_concurrency}, no confirmation", highlight=False)
    if not resume:
        archive_previous(out, console)
    out.mkdir(parents=True, exist_ok=True)
    if not resume:
        write_atomic(out / "spec.yaml", spec_text)  # what --resume reads back
    spec = pin_dataset(spec, out, resume=resume)  # before the chdir below: a relative path is the user's
    traffic, traffic_lines = read_traffic(spec)
    console.print(f"traffic: {escape(traffic.short())}", highlight=False, soft_wrap=True)
    for warning in traffic_lines:
        console.print(f"warning: {escape(warning)}", highlight=False, soft_wrap=True)
    # Out of Ray's copy of the working directory, which Ray may remove while the job runs
    # (docs/design/sweep.md); every path below is absolute.
    os.chdir(out)
    _configure_tune()
    node = ray.get_runtime_context().get_node_id()
    ref = CoordinatorRef(coordinator_name(out))
    coordinator = create_coordinator(
        ref, node=node, results_dir=str(out), tracking_uri=tracking_uri, experiment_name=spec.experiment_name,
        sweep_name=spec.name, spec_text=spec_text, resume=resume, traffic=traffic.model_dump(mode="json"),
        adopt_ended=after_smoke, spec=None if smoke else spec,
    )
    if after_smoke:  # a fresh Tune experiment for the night (the smoke's was sized for two trials)
        smoke_tune = out / "tune"
        if smoke_tune.exists():
            smoke_tune.rename(out / f"tune-smoke-{int(time.time())}")
        write_smoke_state(out, "continued")
    info = ray.get(coordinator.info.remote())
    ray.get(coordinator.log_sweep.remote(  # the parent run's params (a resume: the same) and the traffic's file
        params={**sweep_params(spec), **traffic.mlflow_params()},
        files=[spec.benchmark.dataset_path] if spec.benchmark.dataset_path and not resume else None))
    console.print(f"MLflow: {escape(tracking_uri)} (experiment {escape(spec.experiment_name)}, "
                  f"parent run {info['parent_run_id']}; from {tracking_from})", highlight=False)
    from orchestrator.sweep.execution.trial import TrialContext

    ctx = TrialContext(spec=spec, coordinator=ref, sweep_name=spec.name)
    display = Display(console=console, spec=spec, total=spec.budget.num_trials)
    so_far = [TrialRecord.model_validate(r) for r in ray.get(coordinator.records.remote())]
    ended_before = {r.trial_id for r in so_far}  # a resumed sweep's stop reads this run's trials only
    if finish:
        display.line(f"--finish: the search ends with the {len(so_far)} trial(s) recorded; no search trial runs")
    else:
        plan = night_plan(night_spec, so_far)
        display.line(cost_line(night_spec, so_far, fits=plan.fits))
        for line in plan_lines(plan):  # the night up front (a resume: from what it measured)
            display.line(line)
    budget = TimeBudget(spec, records=WriterRecords(ref))
    tuner = None if finish else _tuner(spec, ctx=ctx, out=out, display=display, ref=ref,
                                       resume=resume and not after_smoke, budget=budget)
    started = time.monotonic()
    in_main = threading.current_thread() is threading.main_thread()
    stop = _StopSignal()
    previous_sigterm = signal.signal(signal.SIGTERM, stop) if in_main else None
    try:
        with QuietWatch(display, needs=spec.trial_placement.describe()):
            stop.in_tune = True
            try:
                if tuner is not None:
                    tuner.fit()
            finally:
                stop.in_tune = False
            if stop.received:
                raise _Interrupted(f"signal {stop.received}")
            records = final_records(coordinator)
            stopped = night_stop([r for r in records if r.trial_id not in ended_before],
                                 max_same_failures=spec.budget.max_same_failures,
                                 probe_thresholds=probe_words(spec))
            if stopped is not None:  # the morning files with the diagnosis (their first line), no confirmation
                outcome = finish_sweep(spec, records=records, confirmation=None, out=out, coordinator=coordinator,
                                       console=console, started=started, stopped=stopped.diagnosis)
                error = stopped.error()
                if error is not None:
                    raise error
                return outcome
            if smoke:
                return _end_smoke(night_spec, records, out=out, coordinator=coordinator, display=display)
            confirm = spec.confirmation.enabled and not (finish and confirmation_minutes is None)
            confirmation = run_cluster_confirmation(spec, records, ctx=ctx, coordinator=coordinator, display=display,
                                                    max_minutes=confirmation_minutes if finish
                                                    else budget.confirmation_minutes(), extend_to=extend_to,
                                                    given_minutes=confirmation_minutes,
                                                    ) if confirm else None
            unconfirmed = ("--finish without --max-minutes: no confirmation was asked for"
                           if finish and spec.confirmation.enabled and confirmation_minutes is None else None)
            return finish_sweep(spec, records=records, confirmation=confirmation, out=out, coordinator=coordinator,
                                console=console, started=started, unconfirmed=unconfirmed)
    except BaseException as exc:
        # Leave no MLflow run RUNNING: open trials are recorded as interrupted, every run ends.
        if isinstance(exc, KeyboardInterrupt):
            console.print(f"sweep interrupted ({exc or 'Ctrl-C'}): open trials recorded as interrupted; continue it "
                          f"with: spectune sweep --resume {escape(str(out))}", highlight=False)
        try:
            ray.get(coordinator.end_sweep.remote(status="KILLED"), timeout=30)
        except Exception:  # noqa: BLE001 - the original error is the one to see
            logger.warning("could not mark the sweep's MLflow runs as ended", exc_info=True)
        raise
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous_sigterm)


def _end_smoke(night: SweepSpec, records: list[TrialRecord], *, out: Path, coordinator: Any,
               display: Display) -> SweepOutcome:
    """A smoke run's end: what passed, the start phases and trial times, and the night re-planned
    from the start time it measured; exit 0 when both baselines passed."""
    import ray

    for line in smoke_lines(records, out=out):
        display.line(line)
    for line in plan_lines(night_plan(night, records)):
        display.line(f"night: {line}")
    ok = smoke_passed(records)
    write_smoke_state(out, "done" if ok else "failed", trials=[r.number for r in records])
    ray.get(coordinator.end_sweep.remote(status="FINISHED" if ok else "FAILED"))
    return SweepOutcome(exit_code=EXIT_OK if ok else EXIT_FAILED, results_dir=out, best_yaml=None,
                        summary={"smoke": [r.model_dump(mode="json") for r in records]})


def _preflight(spec: SweepSpec, *, tracking_uri: str, address: str | None, wait_s: float,
               console: Console) -> SweepSpec:
    """Everything the first trial needs, checked before it (``orchestrator.sweep.execution.sweep_preflight``);
    returns the spec planned for the engine's node (``engine.gpu_kind`` resolved)."""
    def say(line: str) -> None:
        console.print(line, highlight=False, markup=False, soft_wrap=True)

    notes = [check_tracking(tracking_uri)]
    connect_ray(address)
    notes.append(check_resources(spec, wait_s=wait_s, say=say))
    network_note = check_network(spec)
    if network_note:
        notes.append(network_note)
    engine_notes, node = check_engine(spec, wait_s=wait_s, say=say)
    notes += engine_notes
    for note in notes:
        say(f"preflight: {note}")
    planned = spec.on_node(gpu_kind=node["gpu_kind"], architecture=node["architecture"])
    if planned.engine.gpu_kind == "auto":
        return planned
    for line in planned.arms_on_node().lines():
        say(f"preflight: all-reduce arm {line}")
    return planned


def _configure_tune() -> None:
    """Ray Tune's and Optuna's process-wide settings for the driver (docs/design/sweep.md says why)."""
    # A failed trial's report has no objective value.
    os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")
    # The legacy reporter is silent at verbose=0: the job log holds only spectune's lines.
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    # No TensorBoard logger (it imports torch into the driver); JSON and CSV come from tune_callbacks.
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    # Ctrl-C ends the whole sweep, not only the search.
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)


TUNE_STATE_PERIOD_S = "1"
"""How often Tune saves its experiment state (``TUNE_GLOBAL_CHECKPOINT_S``; Tune's own default is at
least 10 s): sooner than any trial can start and finish, so a killed driver never leaves a finished
trial that Tune does not know it started (the searcher would propose it again). A value the user
set is kept."""


def _tuner(spec: SweepSpec, *, ctx: Any, out: Path, display: Display, ref: CoordinatorRef, resume: bool,
           budget: TimeBudget) -> Any:
    """The Tuner: each trial ``trial.run_trial`` in a placement group shaped by
    ``spec.trial_placement``; a resumed sweep restores Tune's experiment. Sets
    ``TUNE_GLOBAL_CHECKPOINT_S`` (:data:`TUNE_STATE_PERIOD_S`) unless it is set."""
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", TUNE_STATE_PERIOD_S)
    placement = spec.trial_placement
    from ray import tune
    from ray.tune import PlacementGroupFactory

    from orchestrator.sweep.execution.trial import run_trial

    bundles = [dict(b) for b in placement.bundles]
    if placement.nnodes > 1:
        # An empty head bundle for the trainable (Ray's ResourceRequest.head_bundle_is_empty), so
        # node rank 0's GPUs stay free for its EngineHost and the bundle indices stay the placement's.
        bundles = [{}, *bundles]
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, ctx=ctx), PlacementGroupFactory(bundles, strategy=placement.strategy),
    )
    tune_dir = out / "tune"
    experiment = tune_dir / spec.name
    if resume and tune.Tuner.can_restore(str(experiment)):
        return tune.Tuner.restore(str(experiment), trainable=trainable, resume_unfinished=True, resume_errored=False,
                                  restart_errored=False)
    _, searcher = sweep_search(spec, slo=bool(spec.objective.slo.limits()), stop_reason=budget.stop_reason)
    early = spec.search.early_stopping
    scheduler = early_stopping_scheduler(early=early, direction=spec.objective.direction,
                                         repetitions=spec.benchmark.repetitions) if early.enabled else None
    return tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(
            search_alg=searcher, scheduler=scheduler, num_samples=spec.budget.num_trials,
            max_concurrent_trials=spec.budget.max_concurrent_trials,
            # a backstop only: the searcher stops starting trials in time (``time_budget``), never killing one
            time_budget_s=None if spec.budget.time_limit_s is None
            else spec.budget.time_limit_s + spec.budget.trial_timeout_s,
            # one trainable actor (its worker process and imports) serves trial after trial; not under
            # ASHA, whose stopped trial measures on until its next report, past Tune's 2 s reset wait
            reuse_actors=not early.enabled,
        ),
        run_config=tune.RunConfig(
            name=spec.name, storage_path=str(tune_dir), failure_config=tune.FailureConfig(max_failures=0),
            callbacks=tune_callbacks(display, ref), verbose=0,
            stop=night_stopper(max_same_failures=spec.budget.max_same_failures,
                               probe_thresholds=probe_words(spec)),
        ),
    )


def sweep_search(spec: SweepSpec, *, slo: bool,
                 stop_reason: Callable[[], str | None] | None = None) -> tuple[DefineByRunSpace, SweepSearcher]:
    """The spec's space and its seeded searcher, for the sweep and its dry run (``preview.dry_run``),
    which therefore shows exactly the points the sweep would start with."""
    space = DefineByRunSpace(spec)
    return space, SweepSearcher(space=space, mode=spec.objective.direction, seed=spec.search.seed,
                              budget=spec.budget.num_trials, slo=slo, stop_reason=stop_reason)


class WriterRecords:
    """The sweep's ended trials as the writer holds them: a picklable callable (Ray Tune pickles the
    searcher whose time budget reads them)."""

    def __init__(self, ref: CoordinatorRef) -> None:
        self.ref = ref

    def __call__(self) -> list[TrialRecord]:
        import ray

        return [TrialRecord.model_validate(r) for r in ray.get(self.ref.get().records.remote())]


class _Interrupted(KeyboardInterrupt):
    """SIGTERM (``ray job stop``, a scheduler ending the job) turned into the Ctrl-C path."""


class _StopSignal:
    """The SIGTERM handler (``ray job stop``). While Tune's loop runs, the stop goes to Tune's own
    stop (its SIGUSR1 handler): the loop ends and Tune saves its experiment state once more, so a
    resumed sweep finds every trial that had started (Tune otherwise saves it at most every 10 s,
    and a trial started since would be lost to Tune and run again under a new number). Elsewhere,
    or at a second signal, it raises :class:`_Interrupted` (the Ctrl-C path)."""

    def __init__(self) -> None:
        self.in_tune = False
        self.received: str | None = None

    def __call__(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        tune_stop = signal.getsignal(signal.SIGUSR1) if hasattr(signal, "SIGUSR1") else None
        if self.in_tune and self.received is None and callable(tune_stop):
            self.received = name
            tune_stop(signum, frame)
            return
        raise _Interrupted(f"signal {name}")
