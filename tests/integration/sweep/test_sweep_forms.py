"""Every spec form the README shows runs end to end, not only ``validate``: listed triples with
NCCL presets, with SGLang's auto choice resolved and never measured twice. (The SIGTERM stop is in
test_sweep_resume.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.engine import processes_with_marker
from helpers.sweep import all_runs_ended, engine_marker, reference_engine, trial_records, write_spec

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

SPECTUNE = str(Path(sys.executable).with_name("spectune"))


def test_listed_triples_and_nccl_presets_run_ok_trials(ray_cluster: dict, tmp_path: Path) -> None:
    """Four points; (3, 1, 4) with NCCL's defaults is where the reference engine's auto choice
    resolves, so it is answered from the auto baseline and never run under its own name. All three
    all-reduce arms are asked for, on the CPU node the preflight finds (gpu_kind auto): gloo carries
    every arm there, so one arm is measured, and each trial records the kernel its engine ran."""
    marker = engine_marker()
    spec = write_spec(
        tmp_path / "spec.yaml",
        engine=reference_engine(tp_size=2, marker=marker),
        search={"speculative": {"triples": [[2, 1, 3], [3, 1, 4]]}, "nccl_env": {},
                "all_reduce": ["default", "no_fusion", "nccl"],
                "nccl_presets": [{}, {"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"}], "seed": 5,
                "early_stopping": {"enabled": False}},
        budget={"num_trials": 4, "max_concurrent_trials": 1, "trial_timeout_s": 300, "engine_start_timeout_s": 120},
        benchmark={"concurrency": [1, 2]},  # the objective's level (2) and one more: per-load results
    )
    results = tmp_path / "results"
    proc = subprocess.run(
        [SPECTUNE, "sweep", str(spec), "--results-dir", str(results), "--address", ray_cluster["address"]],
        env={**os.environ, "SPECTUNE_QUIET_LIMIT_S": "1"}, capture_output=True, text=True, timeout=800,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    records = trial_records(results)
    searched = [r for r in records if r["kind"] == "search"]
    assert len(records) == 4 and len(searched) == 2, [(r["label"], r["status"]) for r in records]
    for record in records:
        assert record["status"] == "ok", (record["label"], record["reason"], record["message"][-2000:])
    for record in searched:
        point = [record["params"][k] for k in ("num_steps", "eagle_topk", "num_draft_tokens")]
        assert point in ([2, 1, 3], [3, 1, 4]) and record["resolved_params"] == dict(
            zip(("num_steps", "eagle_topk", "num_draft_tokens"), point))
        assert {"NCCL_ALGO", "NCCL_PROTO"} <= set(record["params"])
        assert record["label"] != "steps=3 topk=1 draft=4", "SGLang's auto choice, measured twice under two names"
    assert "preflight: all-reduce arm no_fusion:" in log and "measured once, as 'default'" in log, log[-6000:]
    for record in records:  # one arm stands for the three; the kernel is read from the engine, not assumed
        assert record["params"]["all_reduce"] == "default" and record["all_reduce_kernel"] == "nccl"
        assert "--enforce-disable-flashinfer-allreduce-fusion" not in record["engine_command"]
    auto = next(r for r in records if r["kind"] == "baseline_auto")
    assert auto["resolved_params"] == {"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}
    assert auto["label"] == "SGLang auto (= steps 3 topk 1 draft 4)" and auto["label"] in log
    from mlflow.tracking import MlflowClient

    run = MlflowClient(tracking_uri=f"sqlite:///{results / 'mlflow.db'}").get_run(auto["mlflow_run_id"])
    assert run.data.params["resolved.num_steps"] == "3" and run.data.params["resolved.num_draft_tokens"] == "4"
    assert run.data.params["resolved.all_reduce_kernel"] == "nccl" and run.data.tags["spectune.all_reduce_kernel"] == "nccl"
    assert "all-reduce" in log, "the summary table has the all-reduce column"
    assert run.data.tags["mlflow.runName"].endswith("SGLang auto (= steps 3 topk 1 draft 4)")
    for record in records:  # the objective metric's repetitions at every level
        assert set(record["level_values"]) == {"1", "2"} and record["level_values"]["2"] == record["objective"]["values"]
    summary = json.loads((results / "summary.json").read_text())
    assert [e["concurrency"] for e in summary["by_concurrency"]] == [1, 2], summary["by_concurrency"]
    for entry in summary["by_concurrency"]:
        assert f"  at concurrency {entry['concurrency']}: best {entry['best_label']} " in log, log[-4000:]
        assert f"at concurrency {entry['concurrency']}: best " in (results / "summary.txt").read_text()
    # chain configurations only, two repetitions (no interval: never "decidedly" no speculation)
    schedule = json.loads((results / "sglang_adaptive_spec.json").read_text())
    assert [k for k in schedule if k.isdigit()] == ["1", "2"] and all(schedule[k]["candidate_steps"][0] in (2, 3)
                                                                    for k in ("1", "2"))
    assert "SGLang adaptive schedule" in log and "--speculative-adaptive-config" in log
    assert "[still waiting]" in log, "a quiet stretch longer than SPECTUNE_QUIET_LIMIT_S says what it waits for"
    assert all_runs_ended(results)
    assert processes_with_marker(marker) == []
