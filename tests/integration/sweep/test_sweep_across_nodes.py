"""One engine across two nodes: a sweep of an ``engine.nnodes: 2`` spec (ref-tiny, TP 2, a rank on
each node of a two-node ``ray start`` cluster) and ``spectune serve`` of such a config.

Each trial's engine must hold ranks on both nodes (both node ids in its record and MLflow run), the
audit must prove the marker variable reached every rank on both nodes, and a trial whose node-1
engine is killed mid-trial (the reference engine's ``die_after_steps`` fault, armed on node rank 1
for the NCCL_ALGO=Tree trial only) is recorded ``engine_died`` naming node rank 1 while the sweep
goes on; no process is left on either node. Serving: one replica of an engine across the two
nodes answers an OpenAI request and ``/spectune/info`` lists both nodes.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path
from typing import Iterator

import pytest

from serving.ports import free_port

from helpers.engine import processes_with_marker, wait_until
from helpers.ray_cluster import RayCluster
from helpers.serve import ServeProcess, http, new_marker, write_config
from helpers.sweep import REPO, engine_marker, reference_engine, trial_records, write_spec

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

FAULT = "die_after_steps:12@node_rank=1@NCCL_ALGO=Tree"


@pytest.fixture(scope="module")
def cluster(two_nodes: RayCluster) -> RayCluster:
    """The session's two nodes (one CPU, four logical GPUs each): an engine of ``nnodes: 2`` spreads."""
    return two_nodes


@pytest.fixture(scope="module")
def sweep_run(cluster: RayCluster, tmp_path_factory: pytest.TempPathFactory) -> dict:
    work = tmp_path_factory.mktemp("sweep-nodes")
    marker = engine_marker()
    spec = write_spec(
        work / "spec.yaml",
        # NCCL_SOCKET_IFNAME: a network variable in its fixed form, checked on both nodes by the
        # preflight and audited on every rank (gloo ignores it)
        engine=reference_engine(tp_size=2, nnodes=2, marker=marker, extra_args={"context_length": 2048},
                                SPECTUNE_REFERENCE_FAULT=FAULT, NCCL_SOCKET_IFNAME="lo"),
        search={"speculative": {"num_steps": [2], "eagle_topk": [1]}, "nccl_env": {"NCCL_ALGO": ["default", "Tree"]},
                "seed": 1, "early_stopping": {"enabled": False}},
        budget={"num_trials": 4, "max_concurrent_trials": 1, "trial_timeout_s": 300, "engine_start_timeout_s": 150},
        # one round (the search's best and SGLang's default, a fresh engine across both nodes each)
        confirmation={"enabled": True, "top_k": 1, "min_visits": 1, "max_visits": 1, "no_speculation": False,
                      "repetitions_per_visit": 1, "max_host_cpu_steal": None},
        resources={"gpus_per_trial": 2, "cpus_per_trial": 1},
    )
    results = work / "results"
    proc = cluster.submit([sys.executable, "-m", "orchestrator.sweep", str(spec), "--results-dir", str(results)],
                          working_dir=REPO)
    return {"proc": proc, "results": results, "log": proc.stdout + proc.stderr, "marker": marker}


def _records(results: Path) -> dict[str, dict]:
    return {r["label"]: r for r in trial_records(results)}


def test_every_trial_engine_spans_both_nodes_and_is_audited_on_each(sweep_run: dict) -> None:
    assert sweep_run["proc"].returncode == 0, sweep_run["log"][-6000:]
    assert "preflight: network: NCCL_SOCKET_IFNAME checked on 2 nodes that can run an engine rank" in " ".join(
        sweep_run["log"].split()), sweep_run["log"][:4000]
    records = _records(sweep_run["results"])
    healthy = [r for r in records.values() if r["params"].get("NCCL_ALGO") != "Tree"]
    assert len(healthy) == 3 and all(r["status"] == "ok" for r in healthy), records
    for record in healthy:
        nodes = record["engine_nodes"]
        assert [n["node_rank"] for n in nodes] == [0, 1], nodes
        assert len({n["node_id"] for n in nodes}) == 2, "the engine's two ranks on two different Ray nodes"
        assert record["node_id"] == nodes[0]["node_id"]
        assert "--nnodes 2" in record["engine_command"] and "--dist-init-addr" in record["engine_command"]

    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{sweep_run['results'] / 'mlflow.db'}")
    for record in healthy:
        run = client.get_run(record["mlflow_run_id"])
        tagged = json.loads(run.data.tags["spectune.engine_nodes"])
        assert [n["node_id"] for n in tagged] == [n["node_id"] for n in record["engine_nodes"]]
        audit = json.loads(Path(client.download_artifacts(run.info.run_id, "env_audit.json")).read_text())
        assert audit["ok"] and audit["expected"]["SPECTUNE_TEST_MARKER"] == sweep_run["marker"], audit["summary"]
        assert audit["expected"]["NCCL_SOCKET_IFNAME"] == "lo", audit["summary"]
        ranks = [p for p in audit["processes"] if p["role"] == "tp_worker"]
        assert sorted(p["node_rank"] for p in ranks) == [0, 1], audit["summary"]  # one rank per node, each checked
        assert all(p["ok"] for p in audit["processes"]), audit["summary"]


def test_a_node_whose_engine_dies_is_named_and_the_sweep_goes_on(sweep_run: dict) -> None:
    died = next(r for r in _records(sweep_run["results"]).values() if r["params"].get("NCCL_ALGO") == "Tree")
    assert (died["status"], died["reason"]) == ("failed", "engine_died"), died["message"]
    assert "node rank 1" in died["message"], died["message"]
    assert "[trial 4/4]" in sweep_run["log"]


def test_confirmation_visits_run_their_engines_across_both_nodes(sweep_run: dict) -> None:
    lines = (sweep_run["results"] / "confirmation.jsonl").read_text().splitlines()
    visits = [json.loads(line) for line in lines if line.strip()]
    assert len(visits) == 2 and all(v["status"] == "ok" for v in visits), visits
    for visit in visits:
        assert [n["node_rank"] for n in visit["engine_nodes"]] == [0, 1], visit
        assert len({n["node_id"] for n in visit["engine_nodes"]}) == 2, visit
    assert processes_with_marker(sweep_run["marker"]) == [], "no engine process left on either node"


def test_an_interface_one_node_lacks_stops_the_sweep_in_preflight_naming_node_and_variable(
        cluster: RayCluster, tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path / "spec.yaml",
        engine={"kind": "reference", "model_path": "ref-tiny", "tp_size": 2, "nnodes": 2},
        search={"nccl_env": {"NCCL_SOCKET_IFNAME": [None, "lo", "=spectune-missing0"]}, "seed": 1},
        budget={"num_trials": 2, "max_concurrent_trials": 1},
        resources={"gpus_per_trial": 2, "cpus_per_trial": 1},
    )
    proc = cluster.submit([sys.executable, "-m", "orchestrator.sweep", str(spec), "--results-dir",
                           str(tmp_path / "results")], working_dir=REPO)
    log = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode != 0 and "cannot start the sweep (nothing was run)" in log, log[-4000:]
    nodes = set(re.findall(r"search\.nccl_env\.NCCL_SOCKET_IFNAME: NCCL_SOCKET_IFNAME='=spectune-missing0' cannot "
                           r"work on node \S+ \(\S+, Ray node (\w{8}); interfaces ", log))
    assert len(nodes) == 2, log[-4000:]  # each of the two nodes named: both lack it
    assert "NCCL_SOCKET_IFNAME='lo' cannot work" not in log, "an interface both nodes have passes"
    assert "[trial 1/" not in log and not (tmp_path / "results" / "trials.jsonl").exists()


@pytest.fixture(scope="module")
def served(cluster: RayCluster, sweep_run: dict, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    # after the sweep (same cluster, one trial's worth of resources): the fixture order says so
    work = tmp_path_factory.mktemp("serve-nodes")
    marker = new_marker()
    config = write_config(work / "best.yaml", engine={
        "kind": "reference", "model_path": "ref-tiny", "tp_size": 2, "nnodes": 2,
        "env": {"NCCL_ALGO": "Ring", "NCCL_SOCKET_IFNAME": "lo", "SPECTUNE_TEST_MARKER": marker}})
    server = ServeProcess.start(config, port=free_port(), log_dir=work,
                                args=["--gpus-per-replica", "2", "--address", cluster.address])
    try:
        yield {"server": server, "marker": marker}
        assert server.stop() == 0, server.log_tail()
        wait_until(lambda: not processes_with_marker(marker), timeout_s=120, what="every node's engine to be gone")
    finally:
        if server.proc.poll() is None:
            server.kill()
        shutil.rmtree(server.ray_tmp, ignore_errors=True)


def test_serve_of_a_two_node_config_answers_and_lists_both_nodes(served: dict) -> None:
    from openai import OpenAI

    server = served["server"]
    client = OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)
    completion = client.completions.create(model="ref-tiny", prompt="hello", max_tokens=4, temperature=0)
    assert completion.choices[0].text is not None and completion.usage.completion_tokens > 0
    info = http(server.url + "/spectune/info").json()
    nodes = info["engine_nodes"]
    assert [n["node_rank"] for n in nodes] == [0, 1] and len({n["node_id"] for n in nodes}) == 2, info
    audit = http(server.url + "/spectune/audit").json()
    assert audit["ok"] and audit["startup"]["expected"]["NCCL_SOCKET_IFNAME"] == "lo", audit["startup"]["summary"]
    assert served["server"].logs_contain("preflight: network: NCCL_SOCKET_IFNAME checked on"), "checked (rich wraps the line)"
    assert sorted(p["node_rank"] for p in audit["startup"]["processes"] if p["role"] == "tp_worker") == [0, 1]
