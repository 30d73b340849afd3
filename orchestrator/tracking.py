"""MLflow: one parent run per sweep, one nested run per trial. The only module that imports mlflow.

Everything goes through ``MlflowClient`` with explicit run ids (no fluent "active run" state, so
nothing depends on which thread or process last called ``start_run``). A trial's run is nested
under the sweep's run with the ``mlflow.parentRunId`` tag, which is what the MLflow UI groups by.
Runs carry ``spectune.*`` tags (sweep, trial id, status, reason), so a resumed sweep finds the runs
it already made instead of making duplicates.

With a SQLite store, concurrent writers can fail with "database is locked"; the sweep therefore
writes from one place only (the coordinator actor), and this class is not shared between threads.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

import mlflow
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

__all__ = ["Tracker", "TrialRunInfo", "open_tracker"]

logger = logging.getLogger(__name__)

TAG_SWEEP = "spectune.sweep"
TAG_ROLE = "spectune.role"
TAG_TRIAL = "spectune.trial_id"
PARENT_TAG = "mlflow.parentRunId"
_MAX_PARAM = 6000  # MLflow's limit on a parameter value


class TrialRunInfo(dict):
    """``{"run_id": ..., "existing": bool}``: the run of a trial, and whether it was found (resume)."""


class Tracker:
    """Writes a sweep's runs to one MLflow tracking store."""

    def __init__(self, *, tracking_uri: str, experiment_name: str, artifact_root: Path | None = None) -> None:
        """Connect and make sure the experiment exists.

        Args:
            tracking_uri: Any MLflow URI (``sqlite:///.../mlflow.db``, ``http://host:5000``).
            experiment_name: Created if missing.
            artifact_root: Where a new experiment keeps its artifacts (a directory next to the
                SQLite file by default; MLflow would otherwise use ``./mlruns`` of whatever the
                working directory is, which under ``ray job submit`` is a temporary copy).
        """
        self.tracking_uri = tracking_uri
        self.client = MlflowClient(tracking_uri=tracking_uri)
        experiment = self.client.get_experiment_by_name(experiment_name)
        if experiment is None:
            location = artifact_root.resolve().as_uri() if artifact_root is not None else None
            # MLflow 3's UI opens an experiment in its GenAI layout unless told it holds runs
            # of model development: a sweep's runs table (parent + nested trials) is what users want.
            experiment_id = self.client.create_experiment(
                experiment_name, artifact_location=location,
                tags={"mlflow.experimentKind": "custom_model_development"},
            )
        else:
            experiment_id = experiment.experiment_id
        self.experiment_id = experiment_id

    # --- runs ---------------------------------------------------------------------------------

    def find_runs(self, *, tags: Mapping[str, str]) -> list[Any]:
        """Runs of this experiment carrying every tag in ``tags`` (oldest first)."""
        clause = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())
        return list(
            reversed(self.client.search_runs([self.experiment_id], filter_string=clause, max_results=1000))
        )

    def running_children(self, parent_run_id: str) -> list[str]:
        """Ids of the nested runs of ``parent_run_id`` still marked RUNNING."""
        clause = f"tags.`{PARENT_TAG}` = '{parent_run_id}' and attributes.status = 'RUNNING'"
        return [run.info.run_id for run in self.client.search_runs([self.experiment_id], filter_string=clause,
                                                                     max_results=1000)]

    def start_sweep_run(self, *, sweep: str, run_name: str, tags: Mapping[str, str]) -> str:
        """Create the parent run of a sweep; returns its id."""
        run = self.client.create_run(
            self.experiment_id, run_name=run_name, tags={TAG_SWEEP: sweep, TAG_ROLE: "sweep", **tags}
        )
        return run.info.run_id

    def resume_run(self, run_id: str) -> None:
        """Mark a run RUNNING again (a resumed sweep continues its parent run)."""
        self.client.update_run(run_id, status="RUNNING")

    def trial_run(
        self, *, parent_run_id: str, sweep: str, trial_id: str, run_name: str, params: Mapping[str, Any],
        tags: Mapping[str, str],
    ) -> TrialRunInfo:
        """The nested run of ``trial_id``: the existing one (a resumed sweep) or a new one."""
        existing = self.find_runs(tags={PARENT_TAG: parent_run_id, TAG_TRIAL: trial_id})
        if existing:
            run_id = existing[-1].info.run_id
            self.client.update_run(run_id, status="RUNNING")
            return TrialRunInfo(run_id=run_id, existing=True)
        run = self.client.create_run(
            self.experiment_id,
            run_name=run_name,
            tags={PARENT_TAG: parent_run_id, TAG_SWEEP: sweep, TAG_ROLE: "trial", TAG_TRIAL: trial_id, **tags},
        )
        self.log_params(run.info.run_id, params)
        return TrialRunInfo(run_id=run.info.run_id, existing=False)

    # --- data ---------------------------------------------------------------------------------

    def log_params(self, run_id: str, params: Mapping[str, Any]) -> None:
        """Parameters (``None`` shown as ``default``, long values cut at MLflow's limit)."""
        current = self.client.get_run(run_id).data.params
        batch = []
        for key, value in params.items():
            text = "default" if value is None else str(value)
            if key in current:  # parameters are immutable in MLflow; a resumed trial logs the same ones
                continue
            batch.append(Param(key, text[:_MAX_PARAM]))
        for start in range(0, len(batch), 100):
            self.client.log_batch(run_id, params=batch[start : start + 100])

    def log_metrics(self, run_id: str, metrics: Mapping[str, float | None], *, step: int = 0) -> None:
        """Numeric metrics at ``step`` (absent and non-finite values are skipped, never logged as 0)."""
        now = int(time.time() * 1000)
        batch = [
            Metric(key, float(value), now, step)
            for key, value in metrics.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        ]
        for start in range(0, len(batch), 500):
            self.client.log_batch(run_id, metrics=batch[start : start + 500])

    def set_tags(self, run_id: str, tags: Mapping[str, Any]) -> None:
        """Tags (values as strings)."""
        batch = [RunTag(key, "" if value is None else str(value)[:_MAX_PARAM]) for key, value in tags.items()]
        if batch:
            self.client.log_batch(run_id, tags=batch)

    def log_text(self, run_id: str, text: str, artifact_file: str) -> None:
        """A text artifact (an engine log, a JSON report)."""
        self.client.log_text(run_id, text, artifact_file)

    def log_dict(self, run_id: str, data: Any, artifact_file: str) -> None:
        """A JSON (or YAML, by extension) artifact."""
        self.client.log_dict(run_id, data, artifact_file)

    def log_files(self, run_id: str, paths: Iterable[Path], artifact_path: str | None = None) -> None:
        """Local files as artifacts (plots, the spec, best.yaml)."""
        for path in paths:
            if Path(path).exists():
                self.client.log_artifact(run_id, str(path), artifact_path)

    def end_run(self, run_id: str, *, status: str) -> None:
        """Finish a run: ``FINISHED``, ``FAILED`` or ``KILLED``."""
        self.client.set_terminated(run_id, status=status)

    # --- reading (tests, the summary) ---------------------------------------------------------

    def run_status(self, run_id: str) -> str:
        return self.client.get_run(run_id).info.status


def open_tracker(*, tracking_uri: str, experiment_name: str, artifact_root: Path | None = None) -> Tracker:
    """A :class:`Tracker`; quietens MLflow's own start-up chatter (alembic migrations) first."""
    for name in ("alembic", "mlflow.store.db.utils"):
        logging.getLogger(name).setLevel(logging.WARNING)
    mlflow.set_tracking_uri(tracking_uri)  # for mlflow helpers that read it (artifact repositories)
    return Tracker(tracking_uri=tracking_uri, experiment_name=experiment_name, artifact_root=artifact_root)
