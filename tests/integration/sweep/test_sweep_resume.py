"""The spec form the README shows (listed triples, NCCL presets, every all-reduce arm, two load
levels) run end to end by ``spectune sweep --address``, stopped as ``ray job stop`` stops it
(SIGTERM: every MLflow run ends, the log says how to resume), resumed, stopped again with Ray's
SIGKILL 3 s after the SIGTERM (the answer as of the last trial is on disk; ``--finish`` on a copy ends
it from disk without a trial), resumed again: it ends at exactly its plan (no finished trial re-runs, one MLflow run per
trial, the interrupted trials re-run, no engine left behind), with SGLang's auto choice resolved and
never measured twice, and the per-load results. One sweep carries the form and both stops (each
stop costs a driver start, not a sweep)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest
from mlflow.tracking import MlflowClient

from helpers.engine import processes_with_marker, wait_until
from helpers.ray_cluster import RayCluster
from helpers.sweep import all_runs_ended, engine_marker, reference_engine, seed_results, trial_records, write_spec
from orchestrator.sweep.output.morning import read_as_of
from orchestrator.sweep.records.results import best_record, read_records

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1200)]

SPECTUNE = str(Path(sys.executable).with_name("spectune"))
PLANNED = 4
RAY_JOB_STOP_WAIT_S = 3.0
"""Ray's DEFAULT_RAY_JOB_STOP_WAIT_TIME_S (dashboard/modules/job/job_supervisor.py): ``ray job stop``
sends SIGTERM, then SIGKILL this long after when the entrypoint still runs."""


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


def _answered(results: Path) -> bool:
    """The morning set is published as of every recorded trial (best.yaml and the summary agree)."""
    stamps = read_as_of(results)
    summary = results / "summary.json"
    return (stamps["summary.json"] is not None and stamps["summary.json"] == stamps["best.yaml"]
            and json.loads(summary.read_text())["as_of"]["trials_recorded"] >= len(trial_records(results)))


def _run_until(argv: list[str], log: Path, *, env: dict[str, str], until: Callable[[], bool], stop: signal.Signals,
               then_kill_s: float | None = None) -> str:
    """Run the driver until ``until()`` holds, then send ``stop`` to it (its process group for SIGKILL:
    the driver dies without a word); with ``then_kill_s``, SIGKILL that long after (as ``ray job stop``
    does: the wait is the behaviour under test, not a synchronisation). Returns its log."""
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
            if then_kill_s is not None:
                time.sleep(then_kill_s)
                os.killpg(driver.pid, signal.SIGKILL)
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

    # 2. Resumed, then stopped as `ray job stop` stops it (SIGTERM, SIGKILL 3 s later) once three trials are
    #    finished: the night's answer as of its last trial is on disk (issue 57).
    text += _run_until(resume, tmp_path / "second.log", env=env, stop=signal.SIGTERM, then_kill_s=RAY_JOB_STOP_WAIT_S,
                       until=lambda: sum(r["status"] == "ok" for r in trial_records(results)) >= 3
                       and _answered(results))
    before = {r["trial_id"]: r for r in trial_records(results) if r["status"] == "ok"}
    assert len(before) >= 3
    stamps = read_as_of(results)
    assert stamps["summary.json"] is not None and stamps["summary.json"] == stamps["best.yaml"], stamps
    best = best_record(read_records(results / "trials.jsonl"))
    assert best is not None and json.loads((results / "summary.json").read_text())["candidate"]["trial"] == best.number
    best_text = (results / "best.yaml").read_text()
    assert f"unconfirmed candidate: trial {best.number} {best.label}" in best_text and "its engine command: " in best_text
    assert "best.yaml holds SGLang's default configuration until a verdict says otherwise" in best_text

    # 2b. `--finish` on a copy (its own MLflow store) ends the night from disk: the final files, no search trial.
    copy = tmp_path / "finished"
    shutil.copytree(results, copy, symlinks=True)
    state = json.loads((copy / "sweep-state.json").read_text())
    state["tracking_uri"] = f"sqlite:///{copy / 'mlflow.db'}"
    (copy / "sweep-state.json").write_text(json.dumps(state))
    finished = subprocess.run([SPECTUNE, "sweep", "--finish", str(copy), "--address", ray_head.address], env=env,
                              capture_output=True, text=True, timeout=300)
    finish_log = " ".join((finished.stdout + finished.stderr).split())
    assert finished.returncode in (0, 1), finish_log[-4000:]
    assert [r["trial_id"] for r in trial_records(copy)] == [r["trial_id"] for r in trial_records(results)]
    final_summary = json.loads((copy / "summary.json").read_text())
    assert "interim" not in final_summary and not (copy / "morning").exists(), finish_log[-2000:]
    assert (copy / "best.yaml").exists() and not (copy / "best.yaml").is_symlink()
    # this spec runs no confirmation: the finished night takes the search's best, and says why
    assert final_summary["best_trial"] == best.number and "confirmation was off" in final_summary["best_why"]
    assert "--finish: the search ends with the" in finish_log

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
