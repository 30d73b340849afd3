"""best.yaml's provenance block: written by the sweep, read by the serve loader beside (never into)
the engine configuration; a best.yaml without one (written before it existed) still serves."""

from __future__ import annotations

from pathlib import Path

from orchestrator.bench.traffic import TrafficFingerprint

import pytest
import yaml

from orchestrator.sweep.records.results import Objective, TrialRecord, trial_provenance, write_best_yaml
from serving.engine.config import EngineConfig
from serving.serve.options import ServeConfigError, load_serve_file, read_served
from serving.serve.provenance import info_body

ENGINE = EngineConfig.model_validate({
    "kind": "reference", "model_path": "ref-tiny", "tp_size": 2, "speculative_algorithm": "EAGLE3",
    "speculative_draft_model_path": "ref-tiny-draft", "speculative_num_steps": 2, "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 3, "env": {"NCCL_ALGO": "Ring"},
}).model_dump()


def _record() -> TrialRecord:
    return TrialRecord(
        trial_id="t5", number=5, kind="baseline_auto", label="SGLang auto", params={}, status="ok",
        objective=Objective(metric="output_tok_per_s", concurrency=8, direction="max", values=[100.0, 104.0, 102.0],
                            median=102.0, ci95_low=99.5, ci95_high=104.5),
        repetitions_done=3, repetitions_planned=3, measured_in_full=True, engine_config=ENGINE,
        mlflow_run_id="3f2a9c", traffic=_traffic(),
    )


def _traffic() -> dict:
    from orchestrator.bench.datasets import load_prompts
    from orchestrator.bench.traffic import fingerprint

    prompts = load_prompts(dataset="builtin", count=4, seed=0)
    return fingerprint(source="builtin", prompts=prompts, selected=4, seed=0, api="chat", output_len=64,
                       temperature=0.0, ignore_eos=True).model_dump(mode="json")


def _write(path: Path) -> Path:
    provenance = trial_provenance(_record(), sweep="reference-cpu", parent_run_id="p0", tracking_uri="sqlite:///x.db",
                                  experiment="spectune", verdict="indistinguishable",
                                  written_at="2026-01-02T03:04:05+00:00")
    return write_best_yaml(path, engine_config=ENGINE, header_lines=["spectune sweep reference-cpu: the best"],
                           provenance=provenance)


def test_provenance_round_trips_and_the_engine_config_is_unchanged(tmp_path: Path) -> None:
    path = _write(tmp_path / "best.yaml")
    engine, options, provenance = read_served(path)
    assert engine.model_dump() == ENGINE, "the provenance block must never reach the engine configuration"
    assert options.num_replicas is None
    assert provenance is not None and provenance.model_dump() == {
        "sweep": "reference-cpu", "trial": 5, "trial_label": "SGLang auto", "mlflow_run_id": "3f2a9c",
        "parent_run_id": "p0", "tracking_uri": "sqlite:///x.db", "experiment": "spectune",
        "objective": {"metric": "output_tok_per_s", "concurrency": 8, "median": 102.0, "ci95_low": 99.5,
                      "ci95_high": 104.5, "repetitions": 3},
        "verdict": "indistinguishable", "written_at": "2026-01-02T03:04:05+00:00",
        "traffic": TrafficFingerprint.model_validate(_traffic()).short(),
    }
    assert load_serve_file(path)[0] == engine  # the two-part loader the older callers use
    # The file is still an EngineConfig once the provenance block is taken off (as a reader that
    # knows no serve options would do it).
    data = yaml.safe_load(path.read_text())
    data.pop("provenance")
    assert EngineConfig.model_validate(data).model_dump() == ENGINE
    assert provenance.ready_text().startswith("from sweep reference-cpu trial 5 (MLflow run 3f2a9c); tuned on builtin")


def test_a_best_yaml_without_provenance_still_serves(tmp_path: Path) -> None:
    path = write_best_yaml(tmp_path / "best.yaml", engine_config=ENGINE, header_lines=["an old best.yaml"])
    assert "provenance" not in path.read_text()
    engine, _, provenance = read_served(path)
    assert engine.model_dump() == ENGINE and provenance is None
    info = info_body(None, served_since="2026-01-02T03:04:05+00:00", replicas={"num_replicas": 1}, replica="r1")
    assert info["sweep"] is None and info["trial"] is None and info["mlflow_run_id"] is None
    assert info["objective"] is None and info["replicas"] == {"num_replicas": 1}


def test_an_unknown_provenance_field_is_refused_with_its_name(tmp_path: Path) -> None:
    path = _write(tmp_path / "best.yaml")
    path.write_text(path.read_text().replace("  trial_label:", "  trial_lable:"))
    with pytest.raises(ServeConfigError, match=r"provenance\.trial_lable"):
        read_served(path)
