"""What the sweep tests share: a small reference-engine spec to vary, engine markers, MLflow checks."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]

BASE_SPEC: dict[str, Any] = {
    "name": "ci-sweep",
    "engine": {
        "kind": "reference",
        "model_path": "ref-tiny",
        "draft_model_path": "ref-tiny-draft",
        "speculative_algorithm": "EAGLE3",
        "tp_size": 2,
        "extra_args": {"enable_metrics": True, "context_length": 2048},
    },
    "search": {
        "speculative": {"num_steps": [3], "eagle_topk": [1]},
        "nccl_env": {"NCCL_ALGO": ["default", "Tree"]},
        "seed": 7,
        "early_stopping": {"enabled": False},
    },
    "objective": {"metric": "output_tok_per_s", "concurrency": 2},
    # the flow, not the figures: the smallest benchmark and probe that still measure (the logic has unit tests)
    "benchmark": {"dataset": "builtin", "num_prompts": 4, "output_len": 16, "concurrency": [2],
                  "warmup_requests": 1, "repetitions": 2,
                  "warmup": {"tolerance": None}, "min_repetition_s": 0},
    "probe": {"num_prompts": 2, "max_new_tokens": 12},
    "budget": {"num_trials": 4, "max_concurrent_trials": 1, "trial_timeout_s": 300, "engine_start_timeout_s": 120},
    "resources": {"cpus_per_trial": 1},
    "confirmation": {"enabled": False},
}


def write_spec(path: Path, **overrides: Any) -> Path:
    """``BASE_SPEC`` with top-level sections replaced or deep-merged (dicts merge, others replace)."""
    spec = copy.deepcopy(BASE_SPEC)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(spec.get(key), dict):
            merged = dict(spec[key])
            merged.update(value)
            spec[key] = merged
        else:
            spec[key] = value
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return path


def reference_engine(*, tp_size: int, marker: str, extra_args: dict[str, Any] | None = None, nnodes: int = 1,
                     **env: str) -> dict[str, Any]:
    """A spec's ``engine`` section: the CPU reference preset, speculative, its processes marked."""
    engine = {"kind": "reference", "model_path": "ref-tiny", "draft_model_path": "ref-tiny-draft",
              "speculative_algorithm": "EAGLE3", "tp_size": tp_size, "env": {"SPECTUNE_TEST_MARKER": marker, **env}}
    if extra_args:
        engine["extra_args"] = extra_args
    if nnodes > 1:
        engine["nnodes"] = nnodes
    return engine


def trial_records(results: Path) -> list[dict[str, Any]]:
    """The sweep's ``trials.jsonl`` as dicts (``results.read_records``: the last record of a trial
    wins, a torn line is skipped); ``[]`` before the file exists."""
    from orchestrator.sweep.records.results import read_records

    return [record.model_dump(mode="json") for record in read_records(results / "trials.jsonl")]


def seed_results(results: Path, template: Path) -> Path:
    """``results`` created, holding a copy of the migrated empty MLflow store ``template`` as
    ``mlflow.db`` (a sweep keeps an existing store: ``results_dir.archive_previous``)."""
    results.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(template, results / "mlflow.db")
    return results


def engine_marker() -> str:
    """A value for SPECTUNE_TEST_MARKER in a spec's engine.env: the sweep's engines (and their TP
    workers) carry it, so a test finds exactly its own leftovers."""
    import uuid

    return f"sweep-{uuid.uuid4().hex[:12]}"


def all_runs_ended(results: Path) -> bool:
    """Every MLflow run in the results directory's SQLite store is FINISHED, FAILED or KILLED (true
    when there is no store: a sweep that never started made no run)."""
    db = results / "mlflow.db"
    if not db.exists():
        return True
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(experiments, max_results=1000)
    return all(run.info.status in ("FINISHED", "FAILED", "KILLED") for run in runs)
