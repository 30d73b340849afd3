"""The sweep's single writer: a Ray actor on the driver's node that owns the results directory
(MLflow runs, ``trials.jsonl``, ``confirmation.jsonl``, the correctness baseline, trial numbers, and
the interim best.yaml and summary after every recorded trial and visit: ``output.morning``).

A trial's record reaches it one way, through Ray Tune: the trial reports its
:class:`~orchestrator.sweep.records.results.TrialRecord` with every ``tune.report`` and the driver's
callback (``callbacks.py``) hands each one over. A synchronous actor runs its methods one at a
time, the serialisation SQLite and an append-only file need. The class also works without Ray
(the dry run, the unit tests).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.bench.files import write_atomic
from orchestrator.bench.traffic import TrafficFingerprint
from orchestrator.mlflow_schema import (
    ENGINE_CONFIG_ARTIFACT,
    ROLE_TRIAL,
    TAG_EARLY_STOPPED,
    TAG_ALL_REDUCE_KERNEL,
    TAG_AUDIT_OK,
    TAG_BLIND_READERS,
    TAG_CUDA_VISIBLE_DEVICES,
    TAG_ENGINE_COMMAND,
    TAG_ENGINE_NODES,
    TAG_ENGINE_PID,
    TAG_KIND,
    TAG_LABEL,
    TAG_MESSAGE,
    TAG_NCCL_LOG,
    TAG_NODE_ID,
    TAG_NUMBER,
    TAG_OBJECTIVE_CONCURRENCY,
    TAG_OBJECTIVE_METRIC,
    TAG_REASON,
    TAG_RESULTS_DIR,
    TAG_ROLE,
    TAG_START_FLAGS,
    TAG_STATUS,
    TAG_TRIAL_ID,
    engine_nodes_tag,
    tag_value,
)
from orchestrator.sweep.records.results import BASELINE_FILE, CONFIRMATION_FILE, STATE_FILE, TRIALS_FILE
from orchestrator.sweep.records.results import TrialRecord, append_record, read_records, write_json_file
from orchestrator.timestamps import utc_timestamp
from orchestrator.tracking import open_tracker, param_text
from serving.engine.command import render_flags

__all__ = ["DIAGNOSTICS_DIR", "CoordinatorRef", "SweepCoordinator", "coordinator_name"]

logger = logging.getLogger(__name__)


NAMESPACE = "spectune"
"""Ray namespace of the coordinator actor: found by name from any job (a resumed sweep is a new job)."""


def coordinator_name(results_dir: Path) -> str:
    """One coordinator per results directory: a second sweep writing the same one is refused by Ray."""
    return "spectune-coordinator-" + hashlib.sha1(str(results_dir).encode()).hexdigest()[:16]


@dataclass
class CoordinatorRef:
    """The coordinator by name, resolved on first use in each process; it pickles without its handle,
    so a resumed sweep's restored callbacks find the live coordinator."""

    name: str
    namespace: str = NAMESPACE
    _handle: Any = field(default=None, repr=False, compare=False)

    def get(self) -> Any:
        import ray

        if self._handle is None:
            self._handle = ray.get_actor(self.name, namespace=self.namespace)
        return self._handle

    def __getstate__(self) -> dict[str, Any]:
        return {"name": self.name, "namespace": self.namespace, "_handle": None}


_RUN_STATUS = {"ok": "FINISHED", "infeasible": "FINISHED", "early_stopped": "FINISHED", "interrupted": "KILLED"}
"""A trial's MLflow run status from its record's (others: FAILED). An early-stopped trial is FINISHED,
tagged ``spectune.early_stopped=true``; KILLED is for a trial the sweep's end interrupted."""


DIAGNOSTICS_DIR = "diagnostics"
"""Under the results directory: one folder per stop, with what the engine answered (a maintainer's bundle)."""


class SweepCoordinator:
    """Owns ``results_dir``: MLflow writes, trial records, the probe baseline."""

    def __init__(
        self, *, results_dir: str, tracking_uri: str, experiment_name: str, sweep_name: str, spec_text: str,
        resume: bool = False, traffic: dict[str, Any] | None = None, adopt_ended: bool = False,
        spec: Any = None,
    ) -> None:
        self.results_dir = Path(results_dir)
        self._morning_spec = spec
        """The sweep's ``SweepSpec``: with it, the morning files (``output.morning``) are rewritten after
        every recorded trial and visit until :meth:`end_morning`; None (tests, tools): never."""
        self.results_dir.mkdir(parents=True, exist_ok=True)
        self.sweep_name = sweep_name
        self.tracker = open_tracker(
            tracking_uri=tracking_uri, experiment_name=experiment_name, artifact_root=self.results_dir / "mlartifacts"
        )
        state_path = self.results_dir / STATE_FILE
        state = json.loads(state_path.read_text(encoding="utf-8")) if resume and state_path.exists() else {}
        if state.get("parent_run_id"):
            self.parent_run_id: str = state["parent_run_id"]
            self.tracker.resume_run(self.parent_run_id)
            logger.info("resuming sweep %s: MLflow parent run %s", sweep_name, self.parent_run_id)
        else:
            self.parent_run_id = self.tracker.start_sweep_run(
                sweep=sweep_name, run_name=f"sweep {sweep_name}", tags={TAG_RESULTS_DIR: str(self.results_dir)}
            )
            self.tracker.log_text(self.parent_run_id, spec_text, "spec.yaml")
            write_json_file(state_path, {"parent_run_id": self.parent_run_id, "sweep": sweep_name,
                                         "tracking_uri": tracking_uri, "created_at": utc_timestamp()})
        self._traffic = traffic
        """The sweep's traffic (``orchestrator.bench.traffic.TrafficFingerprint`` as a dict): every trial's
        record carries it, and its MLflow run its ``traffic.*`` params (:attr:`_traffic_params`)."""
        self._traffic_params = TrafficFingerprint.model_validate(traffic).mlflow_params() if traffic else {}
        self._records = {r.trial_id: r for r in read_records(self.results_dir / TRIALS_FILE)}
        self._running: dict[str, TrialRecord] = {}
        self._numbers: dict[str, int] = {}
        self._number = max((r.number for r in self._records.values()), default=0)
        self._left_running = self._trial_runs_left_running() if state.get("parent_run_id") else {}
        self._baseline_failure: str | None = None
        self._adoptable = [r for r in self._records.values() if r.status == "ok"] if adopt_ended else []
        """A smoke run's ended trials (``orchestrator.sweep.execution.smoke``) the night's first proposals
        of the same kind and parameters take over instead of starting again."""
        self._adopted: set[str] = set()
        """Trial ids that took over a smoke run's trial (their reserved numbers went back)."""

    # --- the sweep ------------------------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        return {"parent_run_id": self.parent_run_id, "experiment_id": self.tracker.experiment_id,
                "tracking_uri": self.tracker.tracking_uri, "results_dir": str(self.results_dir)}

    def log_sweep(self, *, params: dict[str, Any] | None = None, metrics: dict[str, float] | None = None,
                  tags: dict[str, Any] | None = None, files: list[str] | None = None,
                  texts: dict[str, str] | None = None, run_tags: dict[str, dict[str, Any]] | None = None) -> None:
        """Figures, tags and files (plots, best.yaml, the summary) of the parent run; ``run_tags``:
        tags of the sweep's trial runs by run id (which one best.yaml holds)."""
        for run_id, trial_tags in (run_tags or {}).items():
            self.tracker.set_tags(run_id, trial_tags)
        if params:
            self.tracker.log_params(self.parent_run_id, params)
        if metrics:
            self.tracker.log_metrics(self.parent_run_id, metrics)
        if tags:
            self.tracker.set_tags(self.parent_run_id, tags)
        if files:
            self.tracker.log_files(self.parent_run_id, [Path(f) for f in files])
        for name, text in (texts or {}).items():
            self.tracker.log_text(self.parent_run_id, text, name)

    def end_sweep(self, *, status: str) -> None:
        """End every MLflow run of the sweep: open trials recorded as interrupted, trial runs an
        earlier driver left RUNNING ended KILLED, then the parent run with ``status``."""
        for trial_id in sorted(self._running):
            self.end_running(trial_id=trial_id, status="interrupted", reason="interrupted",
                                message="the sweep ended while the trial ran (Ctrl-C, ray job stop or an error); "
                                "spectune sweep --resume runs it again")
        for run_id in self.tracker.running_children(self.parent_run_id):
            logger.info("MLflow run %s of sweep %s was left running by an earlier driver; ended as KILLED",
                        run_id, self.sweep_name)
            self.tracker.end_run(run_id, status="KILLED")
        self.tracker.end_run(self.parent_run_id, status=status)

    # --- trials ---------------------------------------------------------------------------------
    # A trial's record flows one way: the trial builds it and reports it with every ``tune.report``;
    # the driver's Tune callback (``callbacks.py``) hands each report here. The trial itself calls
    # only ``start_trial`` (its number and MLflow run), ``log_artifacts`` and the baseline's three.

    def reserve_number(self, *, trial_id: str) -> int:
        """The trial's 1-based number in start order (the same on every call for one trial)."""
        if trial_id in self._records:
            return self._records[trial_id].number
        if trial_id not in self._numbers:
            self._number += 1
            self._numbers[trial_id] = self._number
        return self._numbers[trial_id]

    def start_trial(self, record: dict[str, Any]) -> dict[str, Any]:
        """Number a starting trial (``record``: its :class:`TrialRecord`, status ``running``) and give
        it its MLflow run (the existing one when it is re-run). ``engine_config`` goes to the run as
        the artifact ``spectune serve --mlflow-run`` serves; ``start_flags`` as a tag.

        Returns:
            ``{"number", "run_id", "finished", "ended"}``; ``finished`` is the trial's record if it
            already ended (then the trial must not run again), else None; ``ended`` every trial's
            record that has ended so far (what the trial's time limits are derived from).
        """
        rec = TrialRecord.model_validate(record)
        done = self._records.get(rec.trial_id) or self._adopt(rec)
        if done is not None and done.status != "interrupted":
            return {"number": done.number, "run_id": done.mlflow_run_id, "finished": done.model_dump()}
        if done is None:
            self._adopt_lost_run(rec)
        number = done.number if done is not None else self.reserve_number(trial_id=rec.trial_id)
        run = self.tracker.trial_run(
            parent_run_id=self.parent_run_id, sweep=self.sweep_name, trial_id=rec.trial_id,
            run_name=f"trial {number:03d} {rec.label}", params={"trial_kind": rec.kind, **rec.params,
                                                                **self._traffic_params},
            tags={TAG_KIND: rec.kind, TAG_LABEL: rec.label},
        )
        if run["existing"]:
            logger.info("trial %s (%d) runs again; continuing its MLflow run %s", rec.trial_id, number, run["run_id"])
        self.tracker.set_tags(run["run_id"], {TAG_ENGINE_COMMAND: rec.engine_command, TAG_STATUS: "running",
                                              TAG_NUMBER: number, TAG_START_FLAGS: " ".join(render_flags(rec.start_flags))})
        if rec.engine_config:  # what `spectune serve --mlflow-run RUN_ID` serves
            self.tracker.log_dict(run["run_id"], rec.engine_config, ENGINE_CONFIG_ARTIFACT)
        self._running[rec.trial_id] = rec.model_copy(update={"number": number, "mlflow_run_id": run["run_id"]})
        return {"number": number, "run_id": run["run_id"], "finished": None, "ended": self.records()}

    def _adopt(self, rec: TrialRecord) -> TrialRecord | None:
        """A smoke run's ended trial of ``rec``'s kind and parameters, once (None: none left)."""
        for i, ended in enumerate(self._adoptable):
            if ended.kind == rec.kind and ended.params == rec.params:
                del self._adoptable[i]
                # the number reserved for it at its start goes back: the next trial takes the lowest free one
                self._numbers[rec.trial_id] = ended.number
                self._adopted.add(rec.trial_id)
                self._number = max([r.number for r in self._records.values()] + [
                    n for t, n in self._numbers.items() if t not in self._adopted])
                logger.info("trial %d (%s): measured by the smoke run; the night takes its record", ended.number,
                            ended.label)
                return ended
        return None

    def _trial_runs_left_running(self) -> dict[str, tuple[str, dict[str, str], dict[str, str]]]:
        """A resumed sweep's trial runs that an earlier driver left RUNNING with no record (it was
        killed): trial id -> (run id, the run's params, its tags)."""
        found = {}
        for run_id in self.tracker.running_children(self.parent_run_id):
            run = self.tracker.client.get_run(run_id)
            trial_id = run.data.tags.get(TAG_TRIAL_ID)
            if run.data.tags.get(TAG_ROLE) == ROLE_TRIAL and trial_id and trial_id not in self._records:
                found[trial_id] = (run_id, dict(run.data.params), dict(run.data.tags))
        return found

    def _adopt_lost_run(self, rec: TrialRecord) -> None:
        """A killed driver's trial that Tune's saved state never held (Tune saves it at most every
        10 s; SIGKILL leaves no last save) is started again under a new trial id: it continues that
        trial's MLflow run, left RUNNING with the same kind and parameters, instead of a second one."""
        if self._left_running.pop(rec.trial_id, None) is not None:
            return  # Tune saved it: it runs again under its own id and finds its run
        wanted = {"trial_kind": rec.kind, **{k: param_text(v) for k, v in rec.params.items()}}
        for lost, (run_id, logged, tags) in self._left_running.items():
            # killed between creating the run and logging its params: its creation tags say which trial it was
            same = ({k: logged.get(k) for k in wanted} == wanted if logged
                    else (tags.get(TAG_KIND), tags.get(TAG_LABEL)) == (rec.kind, rec.label))
            if same:
                logger.info("trial %s runs again as %s (the stopped driver's Tune never saved it): continuing its "
                            "MLflow run %s", lost, rec.trial_id, run_id)
                self.tracker.set_tags(run_id, {TAG_TRIAL_ID: rec.trial_id})
                del self._left_running[lost]
                return

    def log_artifacts(self, *, trial_id: str, texts: dict[str, str]) -> None:
        """Text artifacts of a running trial (audit, probe, benchmark JSON, engine log)."""
        run_id = self._run_id(trial_id)
        for name, text in texts.items():
            self.tracker.log_text(run_id, text, name)

    def update_trial(self, record: dict[str, Any], *, step: int | None = None,
                     metrics: dict[str, float | None] | None = None) -> None:
        """A running trial's record as it last reported it (Tune's result): what is new goes to its
        MLflow run (node facts and checks as tags, the engine's resolved numbers as params), and one
        repetition's ``metrics`` at ``step`` = repetition (per concurrency level in the names)."""
        rec = TrialRecord.model_validate(record)
        if rec.trial_id not in self._running:
            return  # ended already (a late result): the record written stays
        held = self._running[rec.trial_id]
        rec = rec.model_copy(update={"number": held.number, "mlflow_run_id": held.mlflow_run_id})
        self._running[rec.trial_id] = rec
        self._tell_run(rec, told=held)
        if metrics:
            self.tracker.log_metrics(held.mlflow_run_id, metrics, step=step)

    def _tell_run(self, rec: TrialRecord, *, told: TrialRecord | None) -> None:
        """What ``rec`` knows and ``told`` (the record its MLflow run was last written from; None:
        not known) did not: tags that changed, the engine's resolved numbers as params."""
        run_id = rec.mlflow_run_id
        if not run_id:
            return
        before = _record_tags(told) if told is not None else {}
        tags = {k: v for k, v in _record_tags(rec).items() if v is not None and before.get(k) != v}
        if TAG_LABEL in tags:  # SGLang's auto choice resolved: the label says what it chose
            tags["mlflow.runName"] = f"trial {rec.number:03d} {rec.label}"
        params: dict[str, Any] = {}
        if rec.resolved_params and not (told and told.resolved_params):
            params.update({f"resolved.{k}": v for k, v in rec.resolved_params.items()})
        if rec.all_reduce_kernel and not (told and told.all_reduce_kernel):
            params["resolved.all_reduce_kernel"] = rec.all_reduce_kernel
        if tags:
            self.tracker.set_tags(run_id, tags)
        if params:
            self.tracker.log_params(run_id, params)

    def finish_trial(self, record: dict[str, Any]) -> None:
        """Record a trial's end (its last report): its MLflow run's final tags, metrics and status,
        and one line of trials.jsonl. A trial recorded already (a resumed sweep's finished trial
        reports its record again) is left as it is."""
        rec = TrialRecord.model_validate(record)
        if rec.trial_id in self._records and rec.trial_id not in self._running:
            return
        held = self._running.pop(rec.trial_id, None)
        rec = rec.model_copy(update={
            "number": held.number if held is not None else rec.number,
            "mlflow_run_id": rec.mlflow_run_id or (held.mlflow_run_id if held is not None else None),
            "ended_at": rec.ended_at or utc_timestamp(), "traffic": rec.traffic or self._traffic})
        if rec.mlflow_run_id:
            self._tell_run(rec, told=held)
            summary: dict[str, float | None] = {f"final.{k}": v for k, v in rec.metrics.items()}
            if rec.objective is not None:
                summary.update({
                    "objective.median": rec.objective.median, "objective.ci95_low": rec.objective.ci95_low,
                    "objective.ci95_high": rec.objective.ci95_high,
                    "objective.repetitions": float(len(rec.objective.values)),
                })
            summary.update({f"time.{k}_s": v for k, v in rec.timings_s.as_dict().items()})
            self.tracker.log_metrics(rec.mlflow_run_id, summary)
            self.tracker.set_tags(rec.mlflow_run_id, {
                TAG_STATUS: rec.status, TAG_REASON: rec.reason or "", TAG_NUMBER: rec.number,
                TAG_MESSAGE: tag_value(rec.message), TAG_EARLY_STOPPED: str(rec.status == "early_stopped").lower(),
                **({TAG_OBJECTIVE_METRIC: rec.objective.metric,
                    TAG_OBJECTIVE_CONCURRENCY: rec.objective.concurrency} if rec.objective else {}),
            })
            self.tracker.end_run(rec.mlflow_run_id, status=_RUN_STATUS.get(rec.status, "FAILED"))
        append_record(self.results_dir / TRIALS_FILE, rec)
        self._records[rec.trial_id] = rec
        logger.info("trial %d (%s) recorded: %s%s", rec.number, rec.label, rec.status,
                    f" ({rec.reason})" if rec.reason else "")
        self._write_morning()

    def end_running(self, *, trial_id: str, status: str, reason: str, message: str) -> dict[str, Any] | None:
        """Record a trial that ended without its final report (ASHA stopped it, its worker died, the
        sweep ended): its last reported record, with this outcome.

        Returns the record written, or None (the trial had recorded itself, or never started).
        """
        held = self._running.get(trial_id)
        if held is None:
            return None
        self.finish_trial(held.ended(status=status, reason=reason or None, message=message,  # type: ignore[arg-type]
                                     ended_at=utc_timestamp()).model_dump())
        return self._records[trial_id].model_dump()

    def _run_id(self, trial_id: str) -> str:
        held = self._running.get(trial_id) or self._records.get(trial_id)
        if held is None or held.mlflow_run_id is None:
            raise KeyError(f"trial {trial_id} has not started (start_trial)")
        return held.mlflow_run_id

    def records(self) -> list[dict[str, Any]]:
        """Every finished trial's record, in start order."""
        return [r.model_dump() for r in sorted(self._records.values(), key=lambda r: r.number)]

    def open_trials(self) -> list[str]:
        """Trials that started and have not recorded an end."""
        return sorted(self._running)

    # --- the confirmation round ------------------------------------------------------------------

    def record_visit(self, entry: dict[str, Any]) -> None:
        """One confirmation visit, appended to ``confirmation.jsonl`` (flushed: a resumed sweep reads it back)."""
        path = self.results_dir / CONFIRMATION_FILE
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(entry, default=str) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        if "trial" in entry:  # a visit (not a design line)
            self._write_morning()

    def confirmation_visits(self) -> list[dict[str, Any]]:
        """The visits recorded so far (a torn last line, from a kill mid-write, is skipped)."""
        path = self.results_dir / CONFIRMATION_FILE
        if not path.exists():
            return []
        visits = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                visits.append(json.loads(line))
            except ValueError:
                logger.warning("%s: a torn line (a kill mid-write?) skipped", path)
        return visits

    # --- the morning files ------------------------------------------------------------------------

    def _write_morning(self) -> None:
        """The answer as of now (``output.morning``): best.yaml (SGLang's default, the best ok trial
        named as an unconfirmed candidate) and the summary, published together. A failure is logged,
        never raised: losing the interim answer must not lose a trial's record."""
        if self._morning_spec is None:
            return
        from orchestrator.sweep.output.morning import write_morning_files

        try:
            stamp = write_morning_files(self._morning_spec, sorted(self._records.values(), key=lambda r: r.number),
                                        results_dir=self.results_dir, visits=self.confirmation_visits())
        except Exception:  # noqa: BLE001 - the records are on disk; the next write tries again
            logger.warning("could not rewrite the morning files (best.yaml, summary) in %s", self.results_dir,
                           exc_info=True)
            return
        logger.debug("morning files rewritten as of %s", stamp)

    def end_morning(self) -> None:
        """Stop rewriting the morning files: the final ones are about to be written (``finish``)."""
        self._morning_spec = None

    # --- what a maintainer fixes from --------------------------------------------------------------

    def write_diagnostics(self, *, name: str, files: dict[str, str]) -> str:
        """Write ``files`` (name -> text) atomically under ``<results_dir>/diagnostics/<name>/``;
        returns that folder's path (what a stop's message points to)."""
        folder = self.results_dir / DIAGNOSTICS_DIR / name
        folder.mkdir(parents=True, exist_ok=True)
        for file_name, text in files.items():
            write_atomic(folder / file_name, text)
        return str(folder)

    # --- the correctness baseline ----------------------------------------------------------------

    def put_baseline(self, text: str) -> None:
        """Keep the probe baseline written by the no-speculation trial (atomically, in results_dir)."""
        write_atomic(self.results_dir / BASELINE_FILE, text)

    def baseline_failed(self, reason: str) -> None:
        """The no-speculation trial could not write the baseline: trials waiting for it give up."""
        self._baseline_failure = reason

    def get_baseline(self) -> dict[str, Any]:
        """``{"text": str}`` once written, ``{"failed": reason}`` if it cannot be, else ``{}`` (wait)."""
        path = self.results_dir / BASELINE_FILE
        if path.exists():
            return {"text": path.read_text(encoding="utf-8")}
        if self._baseline_failure:
            return {"failed": self._baseline_failure}
        return {}


def _record_tags(rec: TrialRecord) -> dict[str, Any]:
    """The MLflow tags a running trial's record sets as it learns them (None: not known yet)."""
    first = rec.engine_nodes[0] if rec.engine_nodes else {}
    return {
        TAG_LABEL: rec.label, TAG_NODE_ID: rec.node_id, TAG_CUDA_VISIBLE_DEVICES: rec.cuda_visible_devices,
        TAG_ENGINE_PID: first.get("pid"), TAG_AUDIT_OK: rec.audit_ok,
        TAG_ENGINE_NODES: engine_nodes_tag(rec.engine_nodes) if rec.engine_nodes else None,
        TAG_ALL_REDUCE_KERNEL: rec.all_reduce_kernel, TAG_NCCL_LOG: rec.nccl_log,
        TAG_BLIND_READERS: tag_value("; ".join(rec.blind_readers)) if rec.blind_readers else None,
    }
