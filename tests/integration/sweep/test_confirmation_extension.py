"""``spectune sweep --resume DIR --max-visits N`` on a finished sweep: a small CPU sweep on the
reference engine whose confirmation ends undecided (two visits each: an interval needs three),
then extended to four visits (``--max-visits 4``: two more rounds, the second of which the
feasibility stop may spare). No search trial runs again (trials.jsonl and the MLflow trial runs
unchanged, Ray Tune's restore finds the search finished), the new rounds are visited and recorded
after a design line, and the verdict decides or says why not; ``--max-visits`` not above the last
look is refused before anything starts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from helpers.engine import processes_with_marker, wait_until
from helpers.ray_cluster import RayCluster
from helpers.sweep import engine_marker, reference_engine, seed_results, write_spec

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

SPECTUNE = str(Path(sys.executable).with_name("spectune"))


def _lines(results: Path) -> list[dict]:
    return [json.loads(line) for line in (results / "confirmation.jsonl").read_text().splitlines() if line.strip()]


def _trial_runs(results: Path) -> list[str]:
    client = MlflowClient(tracking_uri=f"sqlite:///{results / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("ci-sweep").experiment_id], max_results=100)
    return sorted(r.info.run_id for r in runs if r.data.tags.get("spectune.role") == "trial")


def test_an_undecided_confirmation_is_extended_without_running_the_search_again(
        ray_head: RayCluster, tmp_path: Path, mlflow_store_template: Path) -> None:
    marker = engine_marker()
    spec = write_spec(
        tmp_path / "spec.yaml",
        engine=reference_engine(tp_size=1, marker=marker),
        search={"speculative": {"num_steps": [2], "eagle_topk": [1]}, "nccl_env": {}, "seed": 1,
                "early_stopping": {"enabled": False}},
        budget={"num_trials": 3, "max_concurrent_trials": 1, "trial_timeout_s": 300, "engine_start_timeout_s": 120},
        # two visits each: never an interval, so always undecided; one repetition a visit, every visit counted
        confirmation={"enabled": True, "top_k": 1, "min_visits": 2, "max_visits": 2, "repetitions_per_visit": 1,
                      "no_speculation": False, "max_host_cpu_steal": None, "margin": 0.1},
    )
    results = seed_results(tmp_path / "results", mlflow_store_template)
    env = {**ray_head.env}
    base = ["--address", ray_head.address]

    first = subprocess.run([SPECTUNE, "sweep", str(spec), "--results-dir", str(results), *base], env=env,
                           capture_output=True, text=True, timeout=300)
    log = first.stdout + first.stderr
    assert first.returncode == 0, log[-6000:]
    summary = json.loads((results / "summary.json").read_text())
    verdict = summary["verdict"]["vs_sglang_default"]
    assert verdict["kind"] == "undecided" and verdict["visits"] == 2, verdict
    line = next(text for text in summary["lines"] if text.startswith("verdict:"))
    # two pairs give a one-degree-of-freedom spread: the proposal may be any size, or none
    assert f"continue with: spectune sweep --resume {results} --max-visits " in line or "no extension" in line, line
    target = 4
    trials_before = (results / "trials.jsonl").read_text()
    runs_before = _trial_runs(results)
    visits_before = _lines(results)
    assert len(visits_before) == 4 and not any("design" in v for v in visits_before)

    refused = subprocess.run([SPECTUNE, "sweep", "--resume", str(results), "--max-visits", "2", *base], env=env,
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "--max-visits 2: the confirmation in" in refused.stderr and "give a number above 3" in refused.stderr

    extended = subprocess.run([SPECTUNE, "sweep", "--resume", str(results), "--max-visits", str(target), *base],
                              env=env, capture_output=True, text=True, timeout=300)
    log = extended.stdout + extended.stderr
    assert extended.returncode == 0, log[-6000:]
    wait_until(lambda: not processes_with_marker(marker), timeout_s=60, what="no engine of this sweep alive")

    assert (results / "trials.jsonl").read_text() == trials_before, "no search trial ran again"
    assert _trial_runs(results) == runs_before, "no new MLflow trial run"
    assert "[trial " not in log.split("confirmation:", 1)[0].split("MLflow:", 1)[-1], "no trial started on resume"
    lines = _lines(results)
    assert lines[:4] == visits_before
    assert "design" in lines[4] and lines[4]["design"]["stages"] == [[3, 3, 0.02], [4, target, 0.0025]], lines[4:]
    new = lines[5:]
    assert {v["round"] for v in new} in ({2}, {2, 3}) and len(new) in (2, 4), new
    assert all(v["status"] == "ok" for v in new) and not any("design" in v for v in new), new
    summary = json.loads((results / "summary.json").read_text())
    verdict = summary["verdict"]["vs_sglang_default"]
    assert verdict["visits"] >= 3, verdict
    assert summary["confirmation"]["extension"].startswith(
        f"extended from 3 to {target} visits; one-sided alpha 0.025 per claim = 0.020 main design (looks 3-3) + "
        f"0.0025 extension 1 (looks 4-{target})"), summary["confirmation"]
    line = next(text for text in summary["lines"] if text.startswith("verdict:"))
    assert verdict["kind"] != "undecided" or "continue with: " in line or "no extension" in line, line
    assert any(text.strip().startswith(f"extended from 3 to {target} visits") for text in summary["lines"]), \
        summary["lines"]
