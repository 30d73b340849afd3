"""One sweep, top to bottom: ``run_sweep``, what ``spectune sweep`` and ``python -m
orchestrator.sweep`` (the ``ray job submit`` entry point) call.

1. **Preflight** (``preflight``): tracking, then Ray (``cluster.connect_ray``: the running
   cluster, else a local one), the cluster's resources and the engine where it will run; then the
   results directory (an earlier sweep's outputs moved to ``history/``, ``results_dir``).
2. **Coordinator** (``cluster.create_coordinator``): the single writer of the results directory
   and MLflow, an actor on the driver's node.
3. **Tuner**: Ray Tune + Optuna over the spec's space (``search``), each trial ``trial.run_trial``
   in a placement group, early stopping that spares the baselines (``scheduler``), progress on
   the console (``callbacks``, ``display``).
4. **Fit**, then every trial's record, the confirmation on fresh engines (``visit``, deciding in
   ``confirm``) and the verdict's files (``finish``). The exit code says whether a valid best
   configuration came out.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Mapping

from rich.console import Console
from rich.markup import escape

from orchestrator.space.define_by_run import DefineByRunSpace
from orchestrator.sweep.callbacks import tune_callbacks
from orchestrator.sweep.cluster import SweepBusyError, connect_ray, create_coordinator
from orchestrator.sweep.cost import cost_line
from orchestrator.sweep.coordinator import (
    STATE_FILE,
    CoordinatorRef,
    coordinator_name,
)
from orchestrator.sweep.display import Display, QuietWatch, job_console
from orchestrator.sweep.finish import SweepOutcome, final_records, finish_sweep
from orchestrator.sweep.preflight import PreflightError, check_engine, check_network, check_resources, check_tracking
from orchestrator.bench.files import write_atomic
from orchestrator.sweep.results import TrialRecord
from orchestrator.sweep.results_dir import archive_previous, resolve_results_dir
from orchestrator.sweep.scheduler import BaselineAwareASHA
from orchestrator.sweep.search import SweepSearcher
from orchestrator.sweep.visit import run_cluster_confirmation
from orchestrator.errors import SpectuneError
from orchestrator.spec import SweepSpec
from orchestrator.summary import sweep_params

__all__ = [
    "PreflightError", "SweepBusyError", "SweepOutcome", "SweepResumeError", "run_sweep", "sweep_search",
]

logger = logging.getLogger(__name__)


class SweepResumeError(SpectuneError):
    """``--resume`` named a directory that holds no sweep."""


def resolve_tracking_uri(spec: SweepSpec, out: Path, *, given: str | None, resume: bool,
                         environ: Mapping[str, str] = os.environ) -> tuple[str, str]:
    """The MLflow tracking URI of the sweep in ``out``, and where it came from.

    ``--tracking-uri`` first, then the spec's ``tracking.mlflow_uri``, then ``$MLFLOW_TRACKING_URI``
    (MLflow's own variable: how a Ray job on Kubernetes names the cluster's MLflow server), then a
    SQLite file in the results directory. A resumed sweep keeps the store it started with (its
    parent run lives there), which its state file recorded.

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
    tracking_uri: str | None = None,
) -> SweepOutcome:
    """Run the whole sweep; returns its outcome (never raises for a failed trial).

    Args:
        tracking_uri: ``--tracking-uri`` (see :func:`resolve_tracking_uri` for the rest).

    Raises:
        PreflightError: the sweep cannot run as specified here (nothing was started or moved).
        SweepResumeError, SweepBusyError: as their names say.
    """
    import ray

    console = console or job_console()
    out = resolve_results_dir(spec.results_dir, results_dir)
    if resume and not (out / STATE_FILE).exists():
        raise SweepResumeError(f"--resume {out}: no sweep to resume there (no {STATE_FILE})")
    tracking_uri, tracking_from = resolve_tracking_uri(spec, out, given=tracking_uri, resume=resume)
    console.print(f"spectune sweep {escape(spec.name)}: results in {escape(str(out))}", highlight=False)
    spec = _preflight(spec, tracking_uri=tracking_uri, address=address, wait_s=wait_for_resources_s, console=console)
    for warning in spec.warnings():
        console.print(f"warning: {escape(warning)}", highlight=False, soft_wrap=True)
    if not resume:
        archive_previous(out, console)
    out.mkdir(parents=True, exist_ok=True)
    if not resume:
        write_atomic(out / "spec.yaml", spec_text)  # what --resume reads back
    # The driver works in the results directory from here on: under `ray job submit` its working
    # directory is Ray's copy of the project, which Ray may garbage-collect while the job still
    # runs (seen with two nodes on one machine, which share that folder); Tune then fails to
    # resolve any relative path. Every path below is absolute already.
    os.chdir(out)
    _configure_tune()
    node = ray.get_runtime_context().get_node_id()
    ref = CoordinatorRef(coordinator_name(out))
    coordinator = create_coordinator(
        ref, node=node, results_dir=str(out), tracking_uri=tracking_uri, experiment_name=spec.experiment_name,
        sweep_name=spec.name, spec_text=spec_text, resume=resume,
    )
    info = ray.get(coordinator.info.remote())
    ray.get(coordinator.log_sweep.remote(params=sweep_params(spec)))  # the parent run's params (a resume: the same)
    console.print(f"MLflow: {escape(tracking_uri)} (experiment {escape(spec.experiment_name)}, "
                  f"parent run {info['parent_run_id']}; from {tracking_from})", highlight=False)
    from orchestrator.sweep.trial import TrialContext

    ctx = TrialContext(spec=spec, coordinator=ref, sweep_name=spec.name)
    display = Display(console=console, spec=spec, total=spec.budget.num_trials)
    # the plan in engine starts x start time (measured by the trials a resumed sweep already ran)
    display.line(cost_line(spec, [TrialRecord.model_validate(r) for r in ray.get(coordinator.records.remote())]))
    tuner = _tuner(spec, ctx=ctx, out=out, display=display, ref=ref, resume=resume)
    started = time.monotonic()
    in_main = threading.current_thread() is threading.main_thread()
    previous_sigterm = signal.signal(signal.SIGTERM, _on_sigterm) if in_main else None
    try:
        with QuietWatch(display, needs=spec.trial_placement.describe()):
            tuner.fit()
            records = final_records(coordinator)
            confirmation = run_cluster_confirmation(spec, records, ctx=ctx, coordinator=coordinator,
                                                    display=display) if spec.confirmation.enabled else None
            return finish_sweep(spec, records=records, confirmation=confirmation, out=out, coordinator=coordinator,
                                console=console, started=started)
    except BaseException as exc:
        # A sweep that cannot finish (Ctrl-C, ray job stop, a bug) leaves no MLflow run RUNNING:
        # its open trials are recorded as interrupted (--resume runs them again), every run ends.
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


def _preflight(spec: SweepSpec, *, tracking_uri: str, address: str | None, wait_s: float,
               console: Console) -> SweepSpec:
    """Everything the first trial needs, checked before it (``orchestrator.sweep.preflight``):
    tracking first (no Ray needed), then the cluster's resources, NCCL's network values on every
    node, then the engine where it will run.
    Returns the spec planned for the node found there (``engine.gpu_kind`` resolved)."""
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
    for line in planned.arm_plan().lines():
        say(f"preflight: all-reduce arm {line}")
    return planned


def _configure_tune() -> None:
    """Ray Tune's and Optuna's process-wide settings for the driver, each for the reason beside it."""
    # Failure reports carry no objective value (a failed trial has none): tell Tune not to insist.
    os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")
    # Ray Tune's own reporter prints its header and tables even at verbose=0; the legacy one is
    # silent at verbose=0, and the job log then holds only spectune's lines (see display.Display).
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    # Tune's default TensorBoard logger imports torch into the driver once trials ask for GPUs
    # (seen to fail there with "Intel oneMKL FATAL ERROR: Cannot load libtorch_cpu.so" on a busy
    # two-node cluster): the automatic loggers are off, and the JSON and CSV ones, which Tune's
    # results need, are passed explicitly (see callbacks.tune_callbacks).
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    # Ctrl-C ends the sweep (Tune's own handler would end only the search and go on to the
    # confirmation round); the interrupted trials are recorded and --resume runs them again.
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)


def _tuner(spec: SweepSpec, *, ctx: Any, out: Path, display: Display, ref: CoordinatorRef, resume: bool) -> Any:
    """The Tuner: each trial ``trial.run_trial`` in a placement group shaped by
    ``spec.trial_placement`` (one node, or a bundle per node of an engine across nodes); a resumed
    sweep restores Tune's experiment (its searcher and callbacks come back with it)."""
    placement = spec.trial_placement
    from ray import tune
    from ray.tune import PlacementGroupFactory

    from orchestrator.sweep.trial import run_trial

    bundles = [dict(b) for b in placement.bundles]
    if placement.nnodes > 1:
        # Tune gives its trainable the whole first bundle, and across nodes bundle 0 also holds node
        # rank 0's GPUs, which its EngineHost must take: an empty head bundle places the trainable
        # in bundle 0 with no resources of its own (Ray's ResourceRequest.head_bundle_is_empty), so
        # the host's bundle indices stay those of the placement.
        bundles = [{}, *bundles]
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, ctx=ctx), PlacementGroupFactory(bundles, strategy=placement.strategy),
    )
    tune_dir = out / "tune"
    experiment = tune_dir / spec.name
    if resume and tune.Tuner.can_restore(str(experiment)):
        return tune.Tuner.restore(str(experiment), trainable=trainable, resume_unfinished=True, resume_errored=False,
                                  restart_errored=False)
    _, searcher = sweep_search(spec, slo=bool(spec.objective.slo.limits()))
    early = spec.search.early_stopping
    scheduler = BaselineAwareASHA.create(early=early, direction=spec.objective.direction,
                                         repetitions=spec.benchmark.repetitions) if early.enabled else None
    return tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(
            search_alg=searcher, scheduler=scheduler, num_samples=spec.budget.num_trials,
            max_concurrent_trials=spec.budget.max_concurrent_trials, time_budget_s=spec.budget.time_limit_s,
            reuse_actors=False,
        ),
        run_config=tune.RunConfig(
            name=spec.name, storage_path=str(tune_dir), failure_config=tune.FailureConfig(max_failures=0),
            callbacks=tune_callbacks(display, ref), verbose=0,
        ),
    )


def sweep_search(spec: SweepSpec, *, slo: bool) -> tuple[DefineByRunSpace, SweepSearcher]:
    """The spec's space and its seeded searcher, built in one place for the sweep and its dry run
    (``preview.dry_run``), so the dry run shows exactly the points the sweep would start with."""
    space = DefineByRunSpace(spec)
    return space, SweepSearcher(space=space, mode=spec.objective.direction, seed=spec.search.seed,
                              budget=spec.budget.num_trials, slo=slo)


class _Interrupted(KeyboardInterrupt):
    """SIGTERM (``ray job stop``, a scheduler ending the job) turned into the Ctrl-C path."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise _Interrupted(f"signal {signal.Signals(signum).name}")
