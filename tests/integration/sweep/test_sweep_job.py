"""The sweep as a user runs it: ``ray job submit`` against a ``ray start`` cluster of two nodes
(one CPU and four logical GPUs each: a trial of four GPUs fits one node, so two trials run at once,
one on each node), then MLflow.

One small sweep on the reference engine (TP 2, two workers over gloo) with the fault switches on
for chosen NCCL settings: ``NCCL_ALGO=Tree`` makes the engine die mid-benchmark, ``NCCL_PROTO=LL128``
corrupts the all-reduce in the workers by the smallest share that changes a confident token (greedy
outputs change, the server stays healthy), every speculative engine's verify pass is off by rounding
(``perturb_verify``, as bf16 on a GPU: outputs flip at near ties, which the probe passes), and
``NCCL_MIN_NCHANNELS`` is set only in the trainable's own environment, as a variable exported in
the driver's shell instead of the runtime_env is (the job's ``SPECTUNE_SWEEP_FAULT``): it never
reaches the engine and the env audit fails that trial. The space holds exactly four points (NCCL
presets), so with the two baselines six trials cover each.
"""

from __future__ import annotations

import json
import re
import sys
from datetime import datetime

import pytest

from helpers.engine import processes_with_marker
from helpers.ray_cluster import RayCluster
from helpers.sweep import REPO, engine_marker, reference_engine, seed_results, trial_records, write_spec

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1200)]

# 200 tokens: past the probe (96, with at most 2 re-anchors of at most 24) and the warm-up (16), within the
# benchmark's 128. perturb_verify: every speculative engine's verify pass is off by rounding (a GPU's bf16 numerics).
# share 0.11: the smallest corruption (in steps of 0.01) that changes a confident token of this probe
# (4 prompts x 24 tokens, steps 2, tp 2); at 0.10 every change it makes is within the near-tie gap.
FAULTS = ("die_after_tokens:200@NCCL_ALGO=Tree;corrupt_allreduce_when:NCCL_PROTO=LL128@share=0.11;"
          "perturb_verify:0.01")
DRIVER_SHELL_ONLY = "env_in_driver_only:NCCL_MIN_NCHANNELS"


@pytest.fixture(scope="module")
def sweep_run(two_nodes: RayCluster, tmp_path_factory: pytest.TempPathFactory, mlflow_store_template) -> dict:
    work = tmp_path_factory.mktemp("sweep-job")
    marker = engine_marker()
    spec = write_spec(
        work / "spec.yaml",
        engine=reference_engine(tp_size=2, marker=marker, extra_args={"enable_metrics": True, "context_length": 2048},
                                SPECTUNE_REFERENCE_FAULT=FAULTS),
        search={"speculative": {"num_steps": [2], "eagle_topk": [1]},
                "nccl_env": {}, "nccl_presets": [{}, {"NCCL_ALGO": "Tree"}, {"NCCL_PROTO": "LL128"},
                                                 {"NCCL_MIN_NCHANNELS": "4"}],
                "allow_dangerous": ["NCCL_PROTO=LL128"], "seed": 3, "early_stopping": {"enabled": False}},
        budget={"num_trials": 6, "max_concurrent_trials": 2, "trial_timeout_s": 300, "engine_start_timeout_s": 120},
        resources={"gpus_per_trial": 4, "cpus_per_trial": 1},
        probe={"num_prompts": 4, "max_new_tokens": 24},
        # the round's flow (its logic is unit-tested): the best and SGLang's default, once each, whatever the VM's steal
        confirmation={"enabled": True, "top_k": 1, "min_visits": 1, "max_visits": 1, "repetitions_per_visit": 1,
                      "no_speculation": False, "max_host_cpu_steal": None},
    )
    results = seed_results(work / "results", mlflow_store_template)
    proc = two_nodes.submit(
        [sys.executable, "-m", "orchestrator.sweep", str(spec), "--results-dir", str(results)], working_dir=REPO,
        runtime_env_json=json.dumps({"env_vars": {"SPECTUNE_SWEEP_FAULT": DRIVER_SHELL_ONLY}}),
    )
    return {"proc": proc, "results": results, "log": proc.stdout + proc.stderr, "marker": marker}


def test_job_completes_and_names_where_results_are(sweep_run: dict) -> None:
    assert sweep_run["proc"].returncode == 0, sweep_run["log"][-6000:]
    assert str(sweep_run["results"]) in sweep_run["log"]
    assert "[trial 6/6]" in sweep_run["log"]
    assert "mlflow ui --backend-store-uri" in sweep_run["log"]


def test_two_nodes_run_trials_at_once(sweep_run: dict) -> None:
    records = trial_records(sweep_run["results"])
    assert len({r["node_id"] for r in records}) == 2, "each node (4 logical GPUs, one CPU) holds a trial: both used"
    spans = [(datetime.fromisoformat(r["started_at"]), datetime.fromisoformat(r["ended_at"])) for r in records]
    assert any(a_start <= b_end and b_start <= a_end for i, (a_start, a_end) in enumerate(spans)
               for (b_start, b_end) in spans[i + 1:]), "two trials ran at the same time"
    assert all(r["cuda_visible_devices"] and len(r["cuda_visible_devices"].split(",")) == 4 for r in records)


def test_every_planned_outcome_is_a_recorded_result(sweep_run: dict) -> None:
    records = {r["label"]: r for r in trial_records(sweep_run["results"])}
    assert len(records) == 6, sorted(records)
    assert records["no speculation"]["status"] == "ok"
    assert records["SGLang auto (= steps 3 topk 1 draft 4)"]["status"] == "ok"
    assert records["steps=2 topk=1 draft=3"]["status"] == "ok"
    died = records["steps=2 topk=1 draft=3 NCCL_ALGO=Tree"]
    assert (died["status"], died["reason"]) == ("failed", "engine_died"), died["message"]
    corrupt = records["steps=2 topk=1 draft=3 NCCL_PROTO=LL128"]
    assert (corrupt["status"], corrupt["reason"]) == ("failed", "probe_mismatch"), corrupt["message"]
    assert re.search(r"prompt \d+ \('[\w-]+'\) differs at token \d+: expected .* got .*a confident token changed",
                     corrupt["message"]), corrupt["message"]
    shell_only = records.pop("steps=2 topk=1 draft=3 NCCL_MIN_NCHANNELS=4")
    assert (shell_only["status"], shell_only["reason"]) == ("failed", "env_audit"), shell_only["message"]
    assert "NCCL_MIN_NCHANNELS" in shell_only["message"] and shell_only["audit_ok"] is False
    for record in records.values():
        assert record["audit_ok"] is True, record
        assert record["node_id"], record
        # the sweep-only start flags: what ran (engine_command), never the config best.yaml is built from
        speculative = record["engine_config"]["speculative_algorithm"] is not None
        assert record["start_flags"] == {"skip_server_warmup": True, "cuda_graph_bs_decode": [1, 2],
                                         "cuda_graph_max_bs_decode": 2}, (record["label"], speculative)
        assert record["engine_command"].endswith("--skip-server-warmup --cuda-graph-bs-decode 1 2 "
                                                 "--cuda-graph-max-bs-decode 2"), record["engine_command"]
        assert set(record["engine_config"]["extra_args"]) == {"enable_metrics", "context_length"}, record
        # its start's phases, from the engine's own SGLang-shaped log lines (CPU: no CUDA graphs)
        phases = record["start_phases_s"]
        assert set(phases) == {"weights", "cuda_graphs", "other"} and phases["cuda_graphs"] == 0, record
        assert phases["weights"] + phases["other"] == pytest.approx(record["timings_s"]["engine_start"], abs=0.01)
        # the limits it ran under: the budget's, or derived from the trials before it (never above them)
        assert record["time_limits_s"]["engine_start"] <= 120 and record["time_limits_s"]["trial"] <= 300, record


def test_speculative_trials_pass_the_probe_with_their_near_tie_flips_reported(sweep_run: dict) -> None:
    """The verify pass is off by rounding (perturb_verify): every speculative output leaves the
    baseline somewhere, which the exact rule fails; the near-tie rule passes each such flip, names it
    in the record and the message, and keeps comparing after it."""
    records = {r["label"]: r for r in trial_records(sweep_run["results"])}
    assert records["no speculation"]["probe_flips"] == [] and records["no speculation"]["accept_histograms"] == {}
    for label in ("SGLang auto (= steps 3 topk 1 draft 4)", "steps=2 topk=1 draft=3"):
        record = records[label]
        assert record["status"] == "ok", record["message"]
        flips = record["probe_flips"]
        assert flips, f"{label}: no flip, so this sweep did not test the rule"
        for flip in flips:
            assert 0 <= flip["gap"] <= 0.5 and flip["expected_token"] != flip["got_token"], flip
        assert record["message"].startswith("probe: all 4 prompts match the baseline"), record["message"]
        assert f"but for {len(flips)} near-tie flip" in record["message"]
        # the accepted-draft histogram of the objective's level: [k] = verify cycles that accepted k drafts
        histogram = record["accept_histograms"]["2"]
        steps = record["resolved_params"]["num_steps"]
        assert sum(histogram) > 0 and len(histogram) <= steps + 1, (label, histogram)
        # each repetition's cycle time beside its throughput: what the chain prediction pairs
        cycles = record["level_cycle_ms"]["2"]
        assert len(cycles) == len(record["level_values"]["2"]) and all(c > 0 for c in cycles), (label, cycles)
        first = flips[0]
        assert f"prompt {first['prompt_index']} ({first['prompt_id']!r}) token {first['position']}" in record["message"]


def test_best_yaml_is_a_measured_speculative_engine_config(sweep_run: dict) -> None:
    from serving.serve.options import read_served

    # what `spectune serve` loads: the EngineConfig, and the provenance block beside it
    config, _, provenance = read_served(sweep_run["results"] / "best.yaml")
    assert config.kind == "reference" and config.tp_size == 2
    assert "NCCL_PROTO" not in config.env or config.env["NCCL_PROTO"] != "LL128"
    summary = json.loads((sweep_run["results"] / "summary.json").read_text())
    assert summary["best_trial"] is not None and summary["counts"]["failed"] == 3
    text = (sweep_run["results"] / "best.yaml").read_text()
    assert text.startswith("# spectune sweep ci-sweep") and "no speculation" in text
    assert "skip_server_warmup" not in text and "cuda_graph_bs_decode" not in text, "served without the sweep's flags"
    assert set(config.extra_args) == {"enable_metrics", "context_length"}, config.extra_args
    assert "cost: " in sweep_run["log"] and "engine starts" in sweep_run["log"]
    assert "confirmation cost: up to 2 engine starts (2 contenders x 1 visits)" in sweep_run["log"]
    confirmation = summary["confirmation"]
    # the one ok search trial and SGLang's default, each visited once on a fresh engine
    roles = [c["role"] for c in confirmation["contenders"]]
    assert roles == ["best", "default"], confirmation["contenders"]
    visits = sorted((v["trial"], v["round"]) for v in confirmation["visits"])
    assert visits == sorted((c["trial"], 0) for c in confirmation["contenders"]), visits
    assert all(len(v["values"]) == 1 for v in confirmation["visits"] if v["status"] == "ok")
    verdict = summary["verdict"]["vs_sglang_default"]
    assert verdict["kind"] == "undecided" and verdict["visits"] == 1, "one visit gives no interval: no verdict"
    assert summary["best_trial"] == confirmation["chosen"] and "verdict:" in text
    chosen = next(r for r in trial_records(sweep_run["results"]) if r["number"] == summary["best_trial"])
    assert (provenance.sweep, provenance.trial, provenance.mlflow_run_id) == ("ci-sweep", chosen["number"],
                                                                            chosen["mlflow_run_id"])
    assert provenance.verdict == "undecided"


def test_mlflow_holds_the_parent_and_one_nested_run_per_trial(sweep_run: dict) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{sweep_run['results'] / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("ci-sweep")
    runs = client.search_runs([experiment.experiment_id], max_results=100)
    parents = [r for r in runs if r.data.tags.get("spectune.role") == "sweep"]
    assert len(parents) == 1
    parent = parents[0]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == 6
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"spec.yaml", "best.yaml", "summary.json", "trials.jsonl"} <= artifacts, artifacts
    assert parent.data.metrics["best.output_tok_per_s"] > 0
    for child in children:
        params = child.data.params
        assert {"NCCL_ALGO", "NCCL_PROTO", "speculative", "num_steps"} <= set(params), params
        names = {a.path for a in client.list_artifacts(child.info.run_id)}
        assert {"env_audit.json", "engine.log"} <= names, (child.data.tags.get("spectune.label"), names)
        assert child.data.tags["spectune.status"] in ("ok", "failed")
        assert child.data.tags["spectune.start_flags"].startswith("--skip-server-warmup --cuda-graph-bs-decode 1 2")
        assert child.info.status in ("FINISHED", "FAILED")
    ok = [c for c in children if c.data.tags["spectune.status"] == "ok"]
    assert len(ok) == 3
    speculative_ok = [c for c in ok if c.data.params.get("speculative") not in (None, "off", "False", "false")]
    for child in speculative_ok:
        assert "accept_histograms.json" in {a.path for a in client.list_artifacts(child.info.run_id)}
    for child in ok:  # NCCL's own per-rank check ran and says why it cannot apply on CPU (gloo)
        assert child.data.tags["spectune.nccl_log"] == "not_applicable"
        assert "nccl_log.json" in {a.path for a in client.list_artifacts(child.info.run_id)}
    for child in ok:
        history = client.get_metric_history(child.info.run_id, "c2.output_tok_per_s")
        assert sorted(m.step for m in history) == [0, 1], "one point per repetition, step = repetition"
        names = {a.path for a in client.list_artifacts(child.info.run_id)}
        assert {"benchmark.json", "probe.json"} <= names
    died = [c for c in children if c.data.tags["spectune.reason"] == "engine_died"]
    assert died and died[0].info.status == "FAILED"


def test_no_engine_outlives_the_sweep(sweep_run: dict) -> None:
    assert processes_with_marker(sweep_run["marker"]) == []
