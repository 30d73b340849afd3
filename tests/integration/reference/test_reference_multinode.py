"""One engine across two nodes, as SGLang 0.5.23 runs it: two engine processes on 127.0.0.1 stand
for two nodes (``--tp-size 2 --nnodes 2``, node ranks 0 and 1, one rank each, meeting at one
``--dist-init-addr``). No Ray: the processes are the production ``EngineProcess``.

What is held: the output is the engine's, not a node's (greedy equals single-node TP 2 and TP 1);
node 1 serves SGLang's dummy health server and no API; each node's process tree holds its own
rank with its own environment (what the env audit reads from each node's engine pid); and no
way of ending leaves a process behind: node 0 stopped (its shutdown broadcast ends node 1), node
1 signalled alone (SGLang's line, a bounded wait, then it stops anyway), node 1 dying hard
mid-generation (the ``die_after_steps`` fault; node 0's collective fails and it exits 1).
"""

from __future__ import annotations

import os
import re
import signal
import urllib.error
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from serving.engine.audit import audit_process_tree
from serving.engine.process import EngineProcess

from helpers.engine import processes_with_marker, read_environ, wait_until
from helpers.reference_core import PROMPTS, greedy_requests, make_models, run_tp
from helpers.reference_server import http, node_processes, running_nodes, running_server, worker_processes

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TP2 = ("--tp-size", "2")
NODE_ENV = [{"NCCL_ALGO": "Ring", "SPECTUNE_TEST_NODE": "node-0"}, {"NCCL_ALGO": "Tree", "SPECTUNE_TEST_NODE": "node-1"}]
"""A different value on each node: each node's ranks must carry their own node's."""
MANAGED = {"NCCL_CUMEM_ENABLE": "0", "NCCL_NVLS_ENABLE": "0", "CUDA_DEVICE_MAX_CONNECTIONS": "8"}
"""What every node's engine process sets for its ranks, as SGLang's _set_envs_and_config does."""
EXIT_S = 30.0
"""Bound on a node's exit once its cause happened (SIGTERM_GRACE_S is 5 s; the rest is teardown)."""


def marked(marker: str, **extra: str) -> list[dict[str, str]]:
    return [{**env, "SPECTUNE_TEST_MARKER": marker, **extra} for env in NODE_ENV]


def body(prompt: str) -> dict:
    return {"text": prompt, "sampling_params": {"max_new_tokens": 24, "temperature": 0}}


def exited(engine: EngineProcess) -> bool:
    return not engine.health(timeout_s=2.0).alive


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[EngineProcess]]:
    with running_nodes(*TP2, "--enable-metrics", nnodes=2, log_dir=tmp_path_factory.mktemp("two-nodes"),
                       envs=marked("two-nodes")) as engines:
        yield engines


def test_greedy_output_across_two_nodes_equals_single_node_tp2_and_tp1(nodes, tmp_path: Path) -> None:
    node0, _ = nodes
    prompts = PROMPTS[:8]
    tp1 = run_tp(make_models(1), greedy_requests(prompts, max_new_tokens=24))
    with running_server(*TP2, log_dir=tmp_path) as single:
        tp2 = [http(single, "/generate", body(p))[1]["output_ids"] for p in prompts]
    across = [http(node0, "/generate", body(p)) for p in prompts]
    assert all(status == 200 for status, _ in across)
    for i, (prompt, (_, out)) in enumerate(zip(prompts, across)):
        assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 24}
        assert out["output_ids"] == tp2[i] == tp1[f"r{i}"], prompt


def test_node1_serves_sglangs_dummy_health_server_and_no_api(nodes) -> None:
    _, node1 = nodes
    for path in ("/ping", "/health", "/health_generate"):
        assert http(node1, path)[0] == 200, path
    for path in ("/v1/models", "/server_info", "/get_server_info", "/flush_cache"):
        assert http(node1, path)[0] == 404, path
    assert http(node1, "/metrics") == (200, ""), "--enable-metrics: the node's own (empty) registry, as SGLang's"
    assert http(node1, "/generate", body("Hello"))[0] in (404, 405)
    assert http(node1, "/v1/completions", {"model": "ref-tiny", "prompt": "Hi"})[0] in (404, 405)


def test_each_nodes_tree_holds_its_own_rank_with_its_own_env(nodes) -> None:
    for rank, (engine, env) in enumerate(zip(nodes, NODE_ENV)):
        workers = worker_processes(engine)
        assert [w.name() for w in workers] == [f"ref::tp{rank}"], f"node {rank}"
        assert read_environ(workers[0].pid)["SPECTUNE_TEST_NODE"] == env["SPECTUNE_TEST_NODE"]
        # The production audit, from this node's engine pid: the node's env everywhere, SGLang's
        # managed variables in its rank.
        report = audit_process_tree(root_pid=engine.pid, expected=env, worker_expected=MANAGED)
        assert report.ok and report.count("tp_worker") == 1, report.summary()
        other = NODE_ENV[1 - rank]
        assert not audit_process_tree(root_pid=engine.pid, expected=other).ok, "the audit must tell the nodes apart"
        log = engine.log_path.read_text()
        line = re.search(rf"worker ref::tp{rank} starting: rank={rank} world_size=2 node_rank={rank} .*", log)
        assert line and f"NCCL_ALGO={env['NCCL_ALGO']}" in line.group(0), f"node {rank}'s rank start-up line"
        assert f"rank {rank} of 2 ready" in log


def test_server_info_reports_the_node_flags(nodes) -> None:
    node0, node1 = nodes
    dist = node0.command.argv[node0.command.argv.index("--dist-init-addr") + 1]
    assert dist == node1.command.argv[node1.command.argv.index("--dist-init-addr") + 1]
    status, info = http(node0, "/server_info")
    assert status == 200
    for where in (info, info["internal_states"][0]):
        assert (where["nnodes"], where["node_rank"], where["dist_init_addr"], where["tp_size"]) == (2, 0, dist, 2)
    assert [w["rank"] for w in info["reference_engine"]["workers"]] == [0], "node 0 reports its own ranks"
    assert "node_rank 1 of 2 ready: TP ranks [1]" in node1.log_path.read_text()


def test_stopping_node0_ends_node1_by_itself(tmp_path: Path) -> None:
    marker = f"stop-node0-{uuid.uuid4().hex[:8]}"
    with running_nodes(*TP2, nnodes=2, log_dir=tmp_path, envs=marked(marker)) as (node0, node1):
        pids = [w.pid for w in worker_processes(node1)]
        assert node0.stop().exit_code == 0
        wait_until(lambda: exited(node1), timeout_s=EXIT_S, what="node 1 to exit after node 0 stopped",
                   detail=node1.log_tail)
        report = node1.stop()
        assert (report.exit_code, report.escalated) == (0, False), node1.log_tail()
    log = node1.log_path.read_text()
    assert "node_rank 1: TP rank 1 exited with code 0 after rank 0's shutdown broadcast" in log
    assert "shutdown requested; rank 1 exiting" in log
    assert not any(os.path.exists(f"/proc/{pid}") for pid in pids)
    assert processes_with_marker(marker) == []


def test_sigterm_on_node1_logs_sglangs_line_waits_then_stops_its_ranks(tmp_path: Path) -> None:
    """No shutdown broadcast comes while node 0 runs on: node 1 gives up after its grace, stops
    its rank, exits 0; node 0's next collective fails and it exits 1."""
    marker = f"sigterm-node1-{uuid.uuid4().hex[:8]}"
    with running_nodes(*TP2, nnodes=2, log_dir=tmp_path, envs=marked(marker)) as (node0, node1):
        os.kill(node1.pid, signal.SIGTERM)  # the server process only, not its group
        wait_until(lambda: exited(node1), timeout_s=EXIT_S, what="node 1 to exit after SIGTERM", detail=node1.log_tail)
        wait_until(lambda: exited(node0), timeout_s=EXIT_S, what="node 0 to exit without node 1", detail=node0.log_tail)
        assert node1.stop().exit_code == 0
        assert node0.stop().exit_code == 1
    log = node1.log_path.read_text()
    # SGLang 0.5.23's line (srt/entrypoints/engine.py), word for word.
    assert ("SIGTERM received on node_rank 1; waiting for the rank-0 ShutdownReq broadcast to stop the schedulers."
            in log)
    assert "node_rank 1: no shutdown broadcast from rank 0 within 5 s; stopping TP ranks [1] anyway" in log
    assert "TP worker rank 0 failed" in node0.log_path.read_text()
    assert processes_with_marker(marker) == []


def test_die_after_steps_kills_node1_mid_generation_and_node0_follows(tmp_path: Path) -> None:
    marker = f"fault-node1-{uuid.uuid4().hex[:8]}"
    envs = marked(marker, SPECTUNE_REFERENCE_FAULT="die_after_steps:40@node_rank=1")
    node0, node1 = node_processes(*TP2, nnodes=2, log_dir=tmp_path, envs=envs)
    try:
        for engine in (node0, node1):
            engine.start()
        for engine in (node0, node1):
            engine.wait_healthy()  # the warm-up's 8 steps are far from 40
        try:
            status, out = http(node0, "/generate", {"text": "Hello", "sampling_params": {"max_new_tokens": 400,
                                                                                          "temperature": 0}})
        except (urllib.error.URLError, ConnectionError):  # node 0 went down before it answered
            status, out = None, None
        if status == 200:
            assert out["meta_info"]["finish_reason"]["type"] == "abort"
            assert out["meta_info"]["completion_tokens"] < 400
        else:
            assert status is None or status >= 500
        wait_until(lambda: exited(node1), timeout_s=EXIT_S, what="node 1 to die", detail=node1.log_tail)
        wait_until(lambda: exited(node0), timeout_s=EXIT_S, what="node 0 to exit without node 1", detail=node0.log_tail)
    finally:
        reports = [node0.stop(), node1.stop()]
    assert reports[1].exit_code == -signal.SIGKILL, "node 1's engine process died hard"
    assert reports[0].exit_code == 1, "node 0 cannot continue without node 1"
    log0, log1 = node0.log_path.read_text(), node1.log_path.read_text()
    assert "fault die_after_steps:40@node_rank=1: this is node_rank 0; off here" in log0
    assert "fault die_after_steps:40@node_rank=1: armed on this node (node_rank 1)" in log1
    assert "node_rank 1's ranks have run 40 steps; killing this node's engine process" in log1
    assert "TP worker rank 0 failed" in log0
    assert processes_with_marker(marker) == []
