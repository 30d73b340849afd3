"""Where a served configuration came from: the ``provenance:`` block of a best-config file.

Metadata only: ``serving.serve.options`` takes it off before the engine part is validated, so it
never reaches the engine. ``GET /spectune/info`` answers with it (nulls for a config without one).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Provenance", "ProvenanceObjective", "info_body"]


class ProvenanceObjective(BaseModel):
    """What the trial measured at the sweep's objective level."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    metric: str | None = Field(default=None, description="The objective's metric (e.g. output_tok_per_s).")
    concurrency: int | None = Field(default=None, description="The concurrency level the objective was measured at.")
    median: float | None = Field(default=None, description="Median of the metric over the trial's repetitions.")
    ci95_low: float | None = Field(
        default=None, description="Low end of the 95% interval of the repetitions' geometric mean (log scale; none "
        "from < 3 values).")
    ci95_high: float | None = Field(default=None, description="High end of that interval.")
    repetitions: int | None = Field(default=None, description="How many repetitions the median is over.")


class Provenance(BaseModel):
    """The sweep, trial and MLflow run a served configuration came from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sweep: str | None = Field(default=None, description="Name of the sweep (its spec's name).")
    trial: int | None = Field(default=None, description="The trial's 1-based number in the sweep.")
    trial_label: str | None = Field(default=None, description="The trial's short human label (e.g. 'SGLang auto').")
    mlflow_run_id: str | None = Field(default=None, description="The trial's MLflow run (nested under the sweep's run).")
    parent_run_id: str | None = Field(default=None, description="The sweep's MLflow run (holds best.yaml and the summary).")
    tracking_uri: str | None = Field(default=None, description="MLflow tracking URI the runs are in.")
    experiment: str | None = Field(default=None, description="MLflow experiment the runs are in.")
    objective: ProvenanceObjective | None = Field(default=None, description="What the trial measured (see there).")
    verdict: str | None = Field(
        default=None, description="The confirmation's verdict against SGLang's default (better, equivalent, "
                                  "worse or undecided); none without a confirmation round.")
    written_at: str | None = Field(default=None, description="When this block was written (ISO 8601, UTC).")
    traffic: str | None = Field(
        default=None, description="The traffic the configuration was tuned on, in one line (dataset, its sha256, "
        "requests, API, sampling: orchestrator.bench.traffic.TrafficFingerprint.short); a configuration is best for "
        "the text it was measured on.")

    def ready_text(self) -> str:
        """``from sweep NAME trial N (MLflow run ID); tuned on TRAFFIC``: the readiness line's account of the run."""
        parts = [f"from sweep {self.sweep or '?'} trial {self.trial if self.trial is not None else '?'}"]
        if self.mlflow_run_id:
            parts.append(f"(MLflow run {self.mlflow_run_id})")
        text = " ".join(parts)
        return f"{text}; tuned on {self.traffic}" if self.traffic else text


def info_body(provenance: dict[str, Any] | None, *, served_since: str | None, replicas: dict[str, Any],
              replica: str) -> dict[str, Any]:
    """What ``GET /spectune/info`` answers: the run a replica serves, since when, and how many replicas.

    Args:
        provenance: ``Provenance.model_dump()`` of the served config, None for a config without one.
        served_since: When this replica's engine became ready (ISO 8601, UTC).
        replicas: ``{"num_replicas": n}`` or ``{"autoscaling": {"min_replicas", "max_replicas"}}``.
        replica: Serve's id of the replica that answers.
    """
    prov = Provenance.model_validate(provenance) if provenance else Provenance()
    return {
        "sweep": prov.sweep,
        "trial": prov.trial,
        "mlflow_run_id": prov.mlflow_run_id,
        "objective": prov.objective.model_dump() if prov.objective else None,
        "served_since": served_since,
        "replicas": replicas,
        "replica": replica,
        "provenance": prov.model_dump() if provenance else None,
    }
