"""MLflow: one parent run per sweep, one nested run per trial. The only module that imports mlflow.

Everything goes through ``MlflowClient`` with explicit run ids; trial runs are nested with the
``mlflow.parentRunId`` tag, and ``spectune.*`` tags let a resumed sweep find its runs. A
:class:`Tracker` is not shared between threads. See docs/design/bench-and-spec.md.
"""

from __future__ import annotations

import logging
import math
import re
import tempfile
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, TypedDict

import yaml
from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from orchestrator.mlflow_schema import (
    ENGINE_CONFIG_ARTIFACT,
    ROLE_SWEEP,
    ROLE_TRIAL,
    TAG_BEST_LABEL,
    TAG_BEST_TRIAL,
    TAG_LABEL,
    TAG_NUMBER,
    TAG_OBJECTIVE_CONCURRENCY,
    TAG_OBJECTIVE_METRIC,
    TAG_ROLE,
    TAG_SWEEP,
    TAG_TRIAL_ID,
    TAG_VERDICT,
)
from orchestrator.tracking_server import health_status
from serving.errors import SpectuneError

__all__ = [
    "ENGINE_CONFIG_ARTIFACT",
    "RecordedConfig",
    "RunConfigError",
    "Tracker",
    "TrialRunInfo",
    "open_tracker",
    "param_text",
    "recorded_config",
    "tag_served",
]

logger = logging.getLogger(__name__)

PARENT_TAG = "mlflow.parentRunId"
BEST_ARTIFACT = "best.yaml"
"""The sweep run's best configuration (the sweep's best.yaml, provenance block included)."""
_MAX_PARAM = 6000  # MLflow's limit on a parameter value


def param_text(value: Any) -> str:
    """A parameter value as it is stored in MLflow: ``None`` as ``default``, cut at MLflow's limit."""
    return ("default" if value is None else str(value))[:_MAX_PARAM]


class TrialRunInfo(TypedDict):
    """The run of a trial, and whether it was found (a resumed sweep) rather than created."""

    run_id: str
    existing: bool


class Tracker:
    """Writes a sweep's runs to one MLflow tracking store."""

    def __init__(self, *, tracking_uri: str, experiment_name: str, artifact_root: Path | None = None) -> None:
        """Connect and make sure the experiment exists.

        Args:
            tracking_uri: Any MLflow URI (``sqlite:///.../mlflow.db``, ``http://host:5000``).
            experiment_name: Created if missing.
            artifact_root: Where a new experiment keeps its artifacts (default: a directory next
                to the SQLite file). Not used with a tracking server (``http(s)://``), whose own
                artifact store holds them.
        """
        self.tracking_uri = tracking_uri
        self.client = MlflowClient(tracking_uri=tracking_uri)
        experiment = self.client.get_experiment_by_name(experiment_name)
        if experiment is None:
            served = tracking_uri.startswith(("http://", "https://"))
            location = artifact_root.resolve().as_uri() if artifact_root is not None and not served else None
            # MLflow 3's UI would otherwise open the experiment in its GenAI layout
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
            self.experiment_id, run_name=run_name, tags={TAG_SWEEP: sweep, TAG_ROLE: ROLE_SWEEP, **tags}
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
        existing = self.find_runs(tags={PARENT_TAG: parent_run_id, TAG_TRIAL_ID: trial_id})
        if existing:
            run_id = existing[-1].info.run_id
            self.client.update_run(run_id, status="RUNNING")
            self.log_params(run_id, params)  # those a killed driver never logged (the others are kept)
            return TrialRunInfo(run_id=run_id, existing=True)
        run = self.client.create_run(
            self.experiment_id,
            run_name=run_name,
            tags={PARENT_TAG: parent_run_id, TAG_SWEEP: sweep, TAG_ROLE: ROLE_TRIAL, TAG_TRIAL_ID: trial_id, **tags},
        )
        self.log_params(run.info.run_id, params)
        return TrialRunInfo(run_id=run.info.run_id, existing=False)

    # --- data ---------------------------------------------------------------------------------

    def log_params(self, run_id: str, params: Mapping[str, Any]) -> None:
        """Parameters (``None`` shown as ``default``, long values cut at MLflow's limit)."""
        current = self.client.get_run(run_id).data.params
        batch = []
        for key, value in params.items():
            if key in current:  # parameters are immutable in MLflow; a resumed trial logs the same ones
                continue
            batch.append(Param(key, param_text(value)))
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


def _quieten_migrations() -> None:
    """MLflow's start-up chatter (alembic migrations of a new SQLite store) to WARNING."""
    for name in ("alembic", "mlflow.store.db.utils"):
        logging.getLogger(name).setLevel(logging.WARNING)


def open_tracker(*, tracking_uri: str, experiment_name: str, artifact_root: Path | None = None) -> Tracker:
    """A :class:`Tracker`, MLflow's migration chatter quietened."""
    _quieten_migrations()
    # not mlflow.set_tracking_uri: it is process-global and leaks MLFLOW_TRACKING_URI to subprocesses
    return Tracker(tracking_uri=tracking_uri, experiment_name=experiment_name, artifact_root=artifact_root)


# --- serving a recorded configuration (``spectune serve --mlflow-run``) ------------------------


class RunConfigError(SpectuneError):
    """A run's configuration cannot be read: the tracking store does not answer, the run is not
    there, or no configuration is recorded on it. The message names the run, the URI and the fix."""


@dataclass(frozen=True)
class RecordedConfig:
    """The configuration recorded on a run, and where it came from.

    Attributes:
        text: YAML the serve loader reads (an engine config, maybe with a provenance block).
        source: Names it in errors (run id, artifact, URI).
        provenance: ``serving.serve.provenance.Provenance`` fields built from the run.
    """

    text: str
    source: str
    provenance: dict[str, Any]


_SQLITE = re.compile(r"^sqlite:///(?P<path>.+)$")


def _check_reachable(tracking_uri: str, *, run_id: str, timeout_s: float) -> None:
    """Refuse a store that is not there before MLflow is asked: a SQLite file that does not exist
    (MLflow would create an empty one), a server that does not answer (MLflow would retry for minutes)."""
    fix = "check --tracking-uri (the sweep printed its URI: 'MLflow: ...'; a sweep's SQLite file is <results>/mlflow.db)"
    sqlite = _SQLITE.match(tracking_uri)
    if sqlite:
        if not Path(sqlite["path"]).is_file():
            raise RunConfigError(f"run {run_id}: tracking URI {tracking_uri} is unreachable: no SQLite file at "
                                 f"{sqlite['path']}; {fix}")
        return
    scheme = urllib.parse.urlparse(tracking_uri).scheme
    if scheme in ("http", "https"):
        try:
            # any status: it answers (a server without /health, or one that wants a login): MLflow says more
            health_status(tracking_uri, timeout_s=timeout_s)
        except (OSError, ValueError) as exc:
            raise RunConfigError(f"run {run_id}: tracking URI {tracking_uri} is unreachable "
                                 f"({type(exc).__name__}: {exc}); is the MLflow server running? {fix}") from None
    elif scheme in ("", "file"):
        path = urllib.parse.urlparse(tracking_uri).path if scheme == "file" else tracking_uri
        if not Path(path).is_dir():
            raise RunConfigError(f"run {run_id}: tracking URI {tracking_uri} is unreachable: no directory {path}; {fix}")


def _client(tracking_uri: str, *, run_id: str, timeout_s: float) -> MlflowClient:
    _quieten_migrations()
    _check_reachable(tracking_uri, run_id=run_id, timeout_s=timeout_s)
    return MlflowClient(tracking_uri=tracking_uri)


def _get_run(client: MlflowClient, run_id: str, tracking_uri: str) -> Any:
    try:
        return client.get_run(run_id)
    except MlflowException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST" or "not found" in str(exc).lower():
            raise RunConfigError(
                f"run {run_id} not found at {tracking_uri}; give the id of a sweep's run (its parent run, "
                "printed as 'MLflow: ... parent run ID') or of one of its trials, and the URI of the store it is in"
            ) from None
        raise RunConfigError(f"run {run_id}: {tracking_uri} answered with an error: {exc}") from None


def _artifact_text(client: MlflowClient, run_id: str, name: str) -> str | None:
    if name not in {a.path for a in client.list_artifacts(run_id)}:
        return None
    with tempfile.TemporaryDirectory(prefix="spectune-run-") as tmp:
        return Path(client.download_artifacts(run_id, name, tmp)).read_text(encoding="utf-8")


def _int(value: Any) -> int | None:
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return None


def _trial_provenance(client: MlflowClient, run: Any, tracking_uri: str) -> dict[str, Any]:
    """Provenance of a trial's run, from its tags and metrics (and its parent's verdict, if the
    parent's best trial is this one)."""
    tags, metrics = run.data.tags, run.data.metrics
    number = _int(tags.get(TAG_NUMBER))
    if number is None:
        named = re.match(r"trial (\d+)", tags.get("mlflow.runName", ""))
        number = int(named[1]) if named else None
    parent_id = tags.get(PARENT_TAG)
    verdict = None
    if parent_id:
        try:
            parent_tags = client.get_run(parent_id).data.tags
            if _int(parent_tags.get(TAG_BEST_TRIAL)) == number:
                verdict = parent_tags.get(TAG_VERDICT)
        except MlflowException:
            logger.warning("run %s: its sweep's run %s is not in %s; the provenance has no verdict",
                           run.info.run_id, parent_id, tracking_uri)
    objective = {
        "metric": tags.get(TAG_OBJECTIVE_METRIC),
        "concurrency": _int(tags.get(TAG_OBJECTIVE_CONCURRENCY)),
        "median": metrics.get("objective.median"), "ci95_low": metrics.get("objective.ci95_low"),
        "ci95_high": metrics.get("objective.ci95_high"), "repetitions": _int(metrics.get("objective.repetitions")),
    }
    return {
        "sweep": tags.get(TAG_SWEEP), "trial": number, "trial_label": tags.get(TAG_LABEL),
        "mlflow_run_id": run.info.run_id, "parent_run_id": parent_id, "tracking_uri": tracking_uri,
        "experiment": client.get_experiment(run.info.experiment_id).name,
        "objective": objective if any(v is not None for v in objective.values()) else None,
        "verdict": verdict,
    }


def recorded_config(*, tracking_uri: str, run_id: str, timeout_s: float = 10.0) -> RecordedConfig:
    """The configuration recorded on ``run_id``: a trial's ``engine_config.yaml``, or a sweep's
    ``best.yaml`` (its provenance block, else one from the run's tags), with provenance naming the run.

    Raises:
        RunConfigError: the store is unreachable, the run is not in it, or it records no configuration.
    """
    client = _client(tracking_uri, run_id=run_id, timeout_s=timeout_s)
    run = _get_run(client, run_id, tracking_uri)
    role = run.data.tags.get(TAG_ROLE)
    name = BEST_ARTIFACT if role == ROLE_SWEEP else ENGINE_CONFIG_ARTIFACT
    text = _artifact_text(client, run_id, name)
    if text is None:
        what = ("the sweep wrote no best.yaml (no trial gave a valid best configuration, or it is still running)"
                if role == ROLE_SWEEP else
                f"a trial run of a spectune older than the {ENGINE_CONFIG_ARTIFACT} artifact, or not a spectune run")
        raise RunConfigError(
            f"run {run_id} at {tracking_uri} records no configuration (no artifact {name}: {what}); serve a best.yaml "
            "file instead, or give the sweep's run id (it holds best.yaml)"
        )
    source = f"MLflow run {run_id} ({name} at {tracking_uri})"
    if role == ROLE_SWEEP:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError:
            data = None  # the serve loader says what is wrong with it
        recorded = data.get("provenance") if isinstance(data, dict) else None
        tags = run.data.tags
        provenance = dict(recorded) if isinstance(recorded, dict) else {
            "sweep": tags.get(TAG_SWEEP), "trial": _int(tags.get(TAG_BEST_TRIAL)),
            "trial_label": tags.get(TAG_BEST_LABEL), "verdict": tags.get(TAG_VERDICT),
            "experiment": client.get_experiment(run.info.experiment_id).name,
        }
        provenance.update(parent_run_id=run_id, tracking_uri=tracking_uri)
        return RecordedConfig(text=text, source=source, provenance=provenance)
    return RecordedConfig(text=text, source=source, provenance=_trial_provenance(client, run, tracking_uri))


def tag_served(*, tracking_uri: str, run_id: str, tags: Mapping[str, Any], timeout_s: float = 5.0) -> None:
    """Tag ``run_id`` as served (``spectune.served_at``, ``spectune.served_by`` ...).

    Raises:
        RunConfigError: the store is unreachable or the run is not in it.
        MlflowException: the store refused the write.
    """
    client = _client(tracking_uri, run_id=run_id, timeout_s=timeout_s)
    _get_run(client, run_id, tracking_uri)
    client.log_batch(run_id, tags=[RunTag(key, str(value)) for key, value in tags.items()])
