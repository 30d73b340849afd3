"""A sweep tuned on the user's own traffic, as a user runs it: ``ray job submit`` of a spec whose
benchmark replays the request log shipped in experiments/traffic/ through ``/v1/chat/completions``
(the reference engine's chat template applied by the server, each request's messages, max_tokens
and sampling replayed, the requests it cannot replay counted), then trials.jsonl, MLflow, the
summary and best.yaml.

The log's path in the spec is relative to the job's working directory (the repository): the sweep
copies it into its results directory before anything else moves, so every trial reads the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from helpers.ray_cluster import RayCluster
from helpers.sweep import REPO, engine_marker, reference_engine, seed_results, trial_records, write_spec

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

LOG = "experiments/traffic/chat-log.jsonl"


@pytest.fixture(scope="module")
def sweep_run(ray_head: RayCluster, tmp_path_factory: pytest.TempPathFactory, mlflow_store_template) -> dict:
    work = tmp_path_factory.mktemp("traffic-sweep")
    spec = write_spec(
        work / "spec.yaml",
        name="ci-traffic",
        engine=reference_engine(tp_size=1, marker=engine_marker(), extra_args={"context_length": 2048}),
        search={"speculative": {"num_steps": [2], "eagle_topk": [1]}, "nccl_env": {}, "seed": 5,
                "early_stopping": {"enabled": False}},
        benchmark={"dataset": "request_log", "dataset_path": LOG, "api": "chat", "num_prompts": 6, "output_len": 24,
                   "concurrency": [2], "warmup_requests": 1, "repetitions": 2, "warmup": {"tolerance": None},
                   "min_repetition_s": 0},
        budget={"num_trials": 3, "max_concurrent_trials": 1, "trial_timeout_s": 300, "engine_start_timeout_s": 120},
    )
    results = seed_results(work / "results", mlflow_store_template)
    proc = ray_head.submit([sys.executable, "-m", "orchestrator.sweep", str(spec), "--results-dir", str(results)],
                           working_dir=REPO)
    return {"proc": proc, "results": results, "log": proc.stdout + proc.stderr,
            "sha256": hashlib.sha256((REPO / LOG).read_bytes()).hexdigest()}


def test_the_job_names_its_traffic_and_what_it_could_not_replay(sweep_run: dict) -> None:
    log = sweep_run["log"]
    assert sweep_run["proc"].returncode == 0, log[-6000:]
    line = next((x for x in log.splitlines() if "traffic: request_log" in x), None)
    assert line is not None, log[-4000:]
    assert "chat-log.jsonl" in line and sweep_run["sha256"][:8] in line and "tools" in line and "images" in line, line
    pinned = sweep_run["results"] / "traffic" / "chat-log.jsonl"
    assert pinned.read_bytes() == (REPO / LOG).read_bytes(), "the sweep keeps the bytes it benchmarked"


def test_every_trial_records_the_fingerprint_and_chat_traffic_keeps_the_histogram(sweep_run: dict) -> None:
    records = trial_records(sweep_run["results"])
    assert len(records) == 3, [r["label"] for r in records]
    for record in records:
        traffic = record["traffic"]
        assert traffic["sha256"] == sweep_run["sha256"] and traffic["api"] == "chat", traffic
        assert traffic["source"] == "request_log" and traffic["not_replayable"], traffic
        assert record["status"] == "ok", record["message"]
    speculative = [r for r in records if r["engine_config"]["speculative_algorithm"]]
    assert len(speculative) == 2
    for record in speculative:  # per-request accept length and the histogram, through the OpenAI chat API
        histogram = record["accept_histograms"]["2"]
        assert sum(histogram) > 0, record["label"]
        assert record["metrics"]["c2.accept_length_requests"] > 1.0, record["metrics"]


def test_mlflow_and_the_summary_and_best_yaml_name_the_traffic(sweep_run: dict) -> None:
    from mlflow.tracking import MlflowClient

    from serving.serve.options import read_served

    results = sweep_run["results"]
    client = MlflowClient(tracking_uri=f"sqlite:///{results / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("ci-traffic")
    runs = client.search_runs([experiment.experiment_id], max_results=20)
    parent = next(r for r in runs if r.data.tags.get("spectune.role") == "sweep")
    assert parent.data.params["traffic.sha256"] == sweep_run["sha256"]
    assert "chat-log.jsonl" in {a.path for a in client.list_artifacts(parent.info.run_id)}
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == 3
    for child in children:
        assert child.data.params["traffic.sha256"] == sweep_run["sha256"]
        assert child.data.params["traffic.api"] == "chat"
        if child.data.params.get("speculative") not in ("off",):
            where = results / "dl" / child.info.run_id
            where.mkdir(parents=True)
            bench = json.loads(Path(client.download_artifacts(child.info.run_id, "benchmark.json", str(where)))
                               .read_text(encoding="utf-8"))
            assert bench["api"] == "chat", bench["api"]  # every request went to /v1/chat/completions
    summary = json.loads((results / "summary.json").read_text())
    assert summary["traffic"]["sha256"] == sweep_run["sha256"]
    assert any(line.startswith("tuned on: request_log") for line in summary["lines"]), summary["lines"]
    _, _, provenance = read_served(results / "best.yaml")
    assert provenance is not None and provenance.traffic and sweep_run["sha256"][:8] in provenance.traffic
    assert "tuned on" in provenance.ready_text()
