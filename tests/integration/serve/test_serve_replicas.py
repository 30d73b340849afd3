"""``spectune serve --address`` with ``num_replicas: 2`` of a tp-1 reference config on a cluster of
4 logical GPUs started with ``RAY_SERVE_ENABLE_HA_PROXY=1`` (as the README says to): each replica
its own engine and GPU, both answering, and one replica's engine killed while the other serves on.
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
from helpers.serve import ServeProcess, http, new_marker, write_config

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
HAPROXY_ENV = {
    "RAY_SERVE_ENABLE_HA_PROXY": "1",
    # Ports HAProxy mode otherwise takes at fixed numbers: never fixed ports in tests.
    **{name: str(free_port()) for name in ("RAY_SERVE_HAPROXY_STATS_PORT", "RAY_SERVE_HAPROXY_METRICS_PORT",
                                           "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT", "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT")},
}


@pytest.fixture(scope="module")
def two_replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    work = tmp_path_factory.mktemp("serve-replicas")
    marker = new_marker()
    config = write_config(
        work / "best.yaml",
        engine={**ENGINE, "env": {"NCCL_ALGO": "Tree", "SPECTUNE_TEST_MARKER": marker}},
        serve={"num_replicas": 2, "gpus_per_replica": 1, "health_check_period_s": 1, "log_dir": str(work / "engines")},
    )
    cluster = RayCluster.start(num_cpus=4, num_gpus=4, env=HAPROXY_ENV)
    server = None
    try:
        server = ServeProcess.start(config, port=free_port(), args=["--address", cluster.address], log_dir=work)
        yield {"server": server, "url": server.url, "marker": marker}
        assert server.stop() == 0, server.log_tail()
        wait_until(lambda: not processes_with_marker(marker), timeout_s=120, what="every engine and replica to be gone")
    finally:
        if server is not None:
            if server.proc.poll() is None:
                server.kill()
            shutil.rmtree(server.ray_tmp, ignore_errors=True)
        cluster.stop()


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
    answered = {http(url + "/v1/completions", body=REQUEST).headers["x-spectune-replica"] for _ in range(20)}
    assert len(answered) == 2, answered
    audits = _replicas_seen(url, want=2)
    assert set(audits) == answered
    assert all(a["ok"] and a["startup"]["expected"]["NCCL_ALGO"] == "Tree" for a in audits.values()), audits
    # Each replica reserved one (logical) GPU in its own placement group: two different devices.
    devices = {a["cuda_visible_devices"] for a in audits.values()}
    assert len(devices) == 2 and all(d and len(d.split(",")) == 1 for d in devices), devices
    assert len({a["engine"]["pid"] for a in audits.values()}) == 2


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

