"""The spec form the README shows (listed triples, NCCL presets, every all-reduce arm, two load
levels) run end to end by ``spectune sweep --address``, stopped as ``ray job stop`` stops it
(SIGTERM: every MLflow run ends, the log says how to resume), resumed, SIGKILLed (no cleanup at
all), resumed again: it ends at exactly its plan (no finished trial re-runs, one MLflow run per
trial, the interrupted trials re-run, no engine left behind), with SGLang's auto choice resolved and
never measured twice, and the per-load results. One sweep carries the form and both stops (each
stop costs a driver start, not a sweep)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest
from mlflow.tracking import MlflowClient

from helpers.engine import processes_with_marker, wait_until
from helpers.ray_cluster import RayCluster
from helpers.sweep import all_runs_ended, engine_marker, reference_engine, seed_results, trial_records, write_spec

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1200)]

SPECTUNE = str(Path(sys.executable).with_name("spectune"))
PLANNED = 4


def _has_trial_run(results: Path, number: int) -> bool:
    """The sweep's MLflow store holds the run of trial ``number`` (``trial 002 ...``)."""
    db = results / "mlflow.db"
    if not db.exists():
        return False
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    experiment = client.get_experiment_by_name("ci-sweep")
    if experiment is None:
        return False
    return bool(client.search_runs([experiment.experiment_id],
                                   filter_string=f"tags.`mlflow.runName` LIKE 'trial {number:03d} %'"))


def _run_until(argv: list[str], log: Path, *, env: dict[str, str], until: Callable[[], bool], stop: signal.Signals) -> str:
    """Run the driver until ``until()`` holds, then send ``stop`` to it (its process group for SIGKILL:
    the driver dies without a word); returns its log."""
    with open(log, "wb") as out:
        driver = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_until(lambda: driver.poll() is not None or until(), timeout_s=600, what=f"the moment to send {stop.name}",
                       poll_s=0.5)
            assert driver.poll() is None, log.read_text()[-4000:]
            if stop == signal.SIGKILL:
                os.killpg(driver.pid, signal.SIGKILL)
            else:
                driver.send_signal(stop)  # what `ray job stop` sends the entrypoint
            driver.wait(timeout=120)
        finally:
            if driver.poll() is None:
                os.killpg(driver.pid, signal.SIGKILL)
                driver.wait(timeout=30)
    assert driver.returncode != 0
    return log.read_text()


def test_the_readme_form_stopped_then_killed_resumes_to_exactly_its_plan(
        ray_head: RayCluster, tmp_path: Path, mlflow_store_template: Path) -> None:
    """Four trials: the two baselines and two of the three listed points; (3, 1, 4) with NCCL's
    defaults is where the reference engine's auto choice resolves, so it is answered from the auto
    baseline and never run under its own name. All three all-reduce arms are asked for, on the CPU
    node the preflight finds (gpu_kind auto): gloo carries every arm there, so one arm is measured,
    and each trial records the kernel its engine ran."""
    marker = engine_marker()
    spec = write_spec(
        tmp_path / "spec.yaml",
        engine=reference_engine(tp_size=2, marker=marker),
        search={"speculative": {"triples": [[2, 1, 3], [3, 1, 4]]}, "nccl_env": {},
                "all_reduce": ["default", "no_fusion", "nccl"],
                "nccl_presets": [{}, {"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"}], "seed": 5,
                "early_stopping": {"enabled": False}},
        budget={"num_trials": PLANNED, "max_concurrent_trials": 1, "trial_timeout_s": 300,
                "engine_start_timeout_s": 120},
        benchmark={"concurrency": [1, 2]},  # the objective's level (2) and one more: per-load results
    )
    results = seed_results(tmp_path / "results", mlflow_store_template)
    first = [SPECTUNE, "sweep", str(spec), "--results-dir", str(results), "--address", ray_head.address]
    resume = [SPECTUNE, "sweep", "--resume", str(results), "--address", ray_head.address]
    env = {**ray_head.env, "SPECTUNE_QUIET_LIMIT_S": "1"}
    client = MlflowClient(tracking_uri=f"sqlite:///{results / 'mlflow.db'}")

    # 1. SIGTERM once trial 2 is open (its MLflow run exists): every run ends, trial 2 is interrupted.
    text = _run_until(first, tmp_path / "first.log", env=env, stop=signal.SIGTERM,
                      until=lambda: "[trial 2/4] start" in (tmp_path / "first.log").read_text()
                      and _has_trial_run(results, 2))
    assert "spectune sweep --resume" in text, text[-4000:]
    assert all_runs_ended(results), text[-4000:]
    runs = client.search_runs([client.get_experiment_by_name("ci-sweep").experiment_id], max_results=100)
    (parent,) = [r for r in runs if r.data.tags.get("spectune.role") == "sweep"]
    assert parent.info.status == "KILLED"
    interrupted = [r for r in trial_records(results) if r["status"] == "interrupted"]
    assert interrupted and interrupted[0]["number"] == 2, trial_records(results)
    wait_until(lambda: not processes_with_marker(marker), timeout_s=60, what="no engine of the stopped sweep alive")

    # 2. Resumed, then SIGKILLed once three trials are finished: no cleanup runs.
    text += _run_until(resume, tmp_path / "second.log", env=env, stop=signal.SIGKILL,
                       until=lambda: sum(r["status"] == "ok" for r in trial_records(results)) >= 3)
    before = {r["trial_id"]: r for r in trial_records(results) if r["status"] == "ok"}
    assert len(before) >= 3

    # 3. Resumed again: it ends at exactly its plan.
    resumed = subprocess.run(resume, env=env, capture_output=True, text=True, timeout=900)
    final_log = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, final_log[-6000:]
    log = text + final_log
    wait_until(lambda: not processes_with_marker(marker), timeout_s=60, what="no engine of this sweep alive")
    final = {r["trial_id"]: r for r in trial_records(results)}
    assert len(final) == PLANNED, sorted((r["number"], r["label"], r["status"]) for r in final.values())
    assert sorted(r["number"] for r in final.values()) == list(range(1, PLANNED + 1))
    for trial_id, record in before.items():
        assert final[trial_id] == record, "a finished trial never runs again"
    assert all(r["status"] == "ok" for r in final.values()), [(r["label"], r["status"], r["reason"])
                                                              for r in final.values()]
    runs = client.search_runs([client.get_experiment_by_name("ci-sweep").experiment_id], max_results=100)
    parents = [r for r in runs if r.data.tags.get("spectune.role") == "sweep"]
    trials = [r for r in runs if r.data.tags.get("spectune.role") == "trial"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert sorted(r.data.tags["spectune.trial_id"] for r in trials) == sorted(final), "one MLflow run per trial"
    assert all(r.info.status == "FINISHED" for r in trials)
    assert (results / "best.yaml").exists()

    # The form: listed triples, presets, arms, the auto choice, two load levels.
    records = list(final.values())
    searched = [r for r in records if r["kind"] == "search"]
    assert len(searched) == 2, [(r["label"], r["kind"]) for r in records]
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
        assert set(record["level_values"]) == {"1", "2"} and record["level_values"]["2"] == record["objective"]["values"]
    auto = next(r for r in records if r["kind"] == "baseline_auto")
    assert auto["resolved_params"] == {"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}
    assert auto["label"] == "SGLang auto (= steps 3 topk 1 draft 4)" and auto["label"] in log
    run = client.get_run(auto["mlflow_run_id"])
    assert run.data.params["resolved.num_steps"] == "3" and run.data.params["resolved.num_draft_tokens"] == "4"
    assert run.data.params["resolved.all_reduce_kernel"] == "nccl" and run.data.tags["spectune.all_reduce_kernel"] == "nccl"
    assert run.data.tags["mlflow.runName"].endswith("SGLang auto (= steps 3 topk 1 draft 4)")
    assert "all-reduce" in final_log, "the summary table has the all-reduce column"
    summary = json.loads((results / "summary.json").read_text())
    assert [e["concurrency"] for e in summary["by_concurrency"]] == [1, 2], summary["by_concurrency"]
    for entry in summary["by_concurrency"]:
        assert f"  at concurrency {entry['concurrency']}: best {entry['best_label']} " in final_log, final_log[-4000:]
        assert f"at concurrency {entry['concurrency']}: best " in (results / "summary.txt").read_text()
    # chain configurations only, two repetitions (no interval: never "decidedly" no speculation)
    schedule = json.loads((results / "sglang_adaptive_spec.json").read_text())
    assert [k for k in schedule if k.isdigit()] == ["1", "2"] and all(schedule[k]["candidate_steps"][0] in (2, 3)
                                                                    for k in ("1", "2"))
    assert "SGLang adaptive schedule" in final_log and "--speculative-adaptive-config" in final_log
    assert "[still waiting]" in log, "a quiet stretch longer than SPECTUNE_QUIET_LIMIT_S says what it waits for"
