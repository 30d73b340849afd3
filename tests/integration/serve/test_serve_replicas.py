"""``spectune serve --address`` with ``num_replicas: 2`` of a tp-1 reference config on the session's cluster
(8 logical GPUs) started with ``RAY_SERVE_ENABLE_HA_PROXY=1`` (as the README says to): each replica
its own engine and GPU, both answering, and one replica's engine killed while the other serves on.
The configuration comes from a trial's MLflow run (``--mlflow-run RUN_ID --tracking-uri``, a real
SQLite store written by the sweep's coordinator), so every replica must answer with that run.
"""

from __future__ import annotations

import os
import shutil
import signal
from typing import Iterator

import pytest

from serving.ports import free_port

from helpers.engine import alive, processes_with_marker, wait_until
from helpers.ray_cluster import RayCluster
from helpers.serve import ServeProcess, http, new_marker, record_trial_run

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ENGINE = {
    "kind": "reference",
    "model_path": "ref-tiny",
    "tp_size": 1,
    "speculative_algorithm": "EAGLE3",
    "speculative_draft_model_path": "ref-tiny-draft",
    "speculative_num_steps": 2,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 3,
}
REQUEST = {"model": "ref-tiny", "prompt": "hello", "max_tokens": 2}
@pytest.fixture(scope="module")
def two_replicas(ray_head: RayCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    work = tmp_path_factory.mktemp("serve-replicas")
    marker = new_marker()
    engine = {**ENGINE, "env": {"NCCL_ALGO": "Tree", "SPECTUNE_TEST_MARKER": marker}}
    run = record_trial_run(work, engine=engine)
    cluster = ray_head  # started with RAY_SERVE_ENABLE_HA_PROXY=1 (tests/conftest.py)
    server: ServeProcess | None = None
    try:
        server = ServeProcess.start(None, port=free_port(), log_dir=work, args=[
            "--mlflow-run", run["run_id"], "--tracking-uri", run["tracking_uri"], "--num-replicas", "2",
            "--gpus-per-replica", "1", "--address", cluster.address])
        yield {"server": server, "url": server.url, "marker": marker, "run": run, "engine": engine}
        assert server.stop() == 0, server.log_tail()
        wait_until(lambda: not processes_with_marker(marker), timeout_s=120, what="every engine and replica to be gone")
    finally:
        if server is not None:
            if server.proc.poll() is None:
                server.kill()
            shutil.rmtree(server.ray_tmp, ignore_errors=True)


def _replicas_seen(url: str, *, want: int, tries: int = 40) -> dict[str, dict]:
    """Audit reports by replica id, asking until ``want`` replicas answered (or ``tries`` ran out)."""
    seen: dict[str, dict] = {}
    for _ in range(tries):
        reply = http(url + "/spectune/audit")
        assert reply.status == 200, reply.body
        seen[reply.headers["x-spectune-replica"]] = reply.json()
        if len(seen) >= want:
            break
    return seen


@pytest.mark.timeout(180)
def test_both_replicas_answer_each_with_its_own_engine_and_gpu(two_replicas: dict) -> None:
    url = two_replicas["url"]
    assert "2 replicas" in two_replicas["server"].ready_line and "haproxy ingress" in two_replicas["server"].ready_line
    # The ready line comes once the ingress answers; the second replica joins HAProxy's rotation
    # at its first health check (every 5 s by default): wait for it, bounded.
    answered: set[str] = set()

    def both_answered() -> bool:
        answered.add(http(url + "/v1/completions", body=REQUEST).headers["x-spectune-replica"])
        return len(answered) == 2

    wait_until(both_answered, timeout_s=60, what="both replicas to answer completions", poll_s=0.1)
    audits = _replicas_seen(url, want=2)
    assert set(audits) == answered
    assert all(a["ok"] and a["startup"]["expected"]["NCCL_ALGO"] == "Tree" for a in audits.values()), audits
    # Each replica reserved one (logical) GPU in its own placement group: two different devices.
    devices = {a["cuda_visible_devices"] for a in audits.values()}
    assert len(devices) == 2 and all(d and len(d.split(",")) == 1 for d in devices), devices
    assert len({a["engine"]["pid"] for a in audits.values()}) == 2


@pytest.mark.timeout(120)
def test_mlflow_run_serves_the_recorded_configuration_and_names_the_run(two_replicas: dict) -> None:
    url, run, engine = two_replicas["url"], two_replicas["run"], two_replicas["engine"]
    assert f"from sweep serve-test trial 1 (MLflow run {run['run_id']})" in two_replicas["server"].ready_line
    infos, audits = {}, _replicas_seen(url, want=2)
    for _ in range(40):
        reply = http(url + "/spectune/info")
        infos[reply.headers["x-spectune-replica"]] = reply.json()
        if len(infos) == 2:
            break
    assert set(infos) == set(audits), (infos, audits)
    print("ready line:", two_replicas["server"].ready_line.strip(), "\ninfo:", next(iter(infos.values())))  # -s shows it
    for info in infos.values():  # the same answer a served best.yaml of that trial gives
        assert (info["sweep"], info["trial"], info["mlflow_run_id"]) == ("serve-test", 1, run["run_id"]), info
        assert info["objective"] == run["provenance"]["objective"] and info["replicas"] == {"num_replicas": 2}
        assert info["provenance"]["parent_run_id"] == run["parent_run_id"]
    for audit in audits.values():  # the engine is the recorded one: kind, model, TP, env
        assert {k: audit["engine"][k] for k in ("kind", "model_path", "tp_size")} == {
            k: engine[k] for k in ("kind", "model_path", "tp_size")}, audit["engine"]
        assert audit["startup"]["expected"] == engine["env"], audit["startup"]


@pytest.mark.timeout(180)
def test_killing_one_replicas_engine_leaves_the_other_serving(two_replicas: dict) -> None:
    url = two_replicas["url"]
    audits = _replicas_seen(url, want=2)
    victim, survivor = sorted(audits)
    victim_pids = [p["pid"] for p in audits[victim]["now"]["processes"]]
    os.kill(audits[victim]["engine"]["pid"], signal.SIGKILL)
    outcomes = []
    for _ in range(30):
        reply = http(url + "/v1/completions", body=REQUEST, timeout_s=60)
        outcomes.append((reply.status, reply.headers.get("x-spectune-replica")))
    # The survivor keeps answering; the dead engine's replica answers 503 at once until it is out
    # of rotation; nothing else happens.
    assert sum(1 for status, who in outcomes if status == 200 and who == survivor) >= 10, outcomes
    assert all(status == 200 or (status == 503 and who == victim) for status, who in outcomes), outcomes
    wait_until(lambda: not any(alive(pid) for pid in victim_pids), timeout_s=30,
               what="the killed engine's processes to be gone")
    # Serve replaces the victim: two healthy replicas again, the victim's id gone.
    def replaced() -> bool:
        now = _replicas_seen(url, want=2, tries=20)
        return len(now) == 2 and victim not in now and all(a["ok"] for a in now.values())

    wait_until(replaced, timeout_s=120, what="Serve to replace the replica whose engine died", poll_s=1.0)

