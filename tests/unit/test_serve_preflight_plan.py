"""``spectune serve``'s preflight without Ray: the replicas' resources against given nodes (one
replica's GPUs must be on one node), waiting for them, and the engine check of this machine
(an unknown preset, a missing local path, a hub id not in the node's cache)."""

from __future__ import annotations

import math
import signal
import subprocess
import sys
import time

import psutil
import pytest

from serving.engine.config import EngineConfig
from serving.engine.node_checks import engine_problems, units_that_fit
from serving.serve.cluster import stop_leftovers
from serving.serve.options import ServeOptions
from serving.serve.serve_preflight import ServePreflightError, check_engine_here, check_resources

SGLANG_TP8 = EngineConfig(kind="sglang", model_path="moonshotai/Kimi-K2", tp_size=8)
REFERENCE = EngineConfig(kind="reference", model_path="ref-tiny", tp_size=2)


def _nodes(*gpus_cpus: tuple[float, float]) -> list[dict[str, float]]:
    return [{"GPU": g, "CPU": c} for g, c in gpus_cpus]


def test_units_that_fit_counts_each_node_on_its_own() -> None:
    nodes = _nodes((8, 16), (4, 2))
    assert units_that_fit(nodes, {"GPU": 5, "CPU": 1}) == 1  # 12 GPUs in all, but 5 fit only on the first node
    assert units_that_fit(nodes, {"GPU": 4, "CPU": 1}) == 3
    assert units_that_fit(nodes, {"GPU": 0, "CPU": 3}) == 5  # CPUs only
    assert units_that_fit(nodes, {"CPU": 0}) == math.inf
    assert units_that_fit([], {"CPU": 1}) == 0


def test_tp8_on_two_4_gpu_nodes_is_refused_naming_per_replica_needs_and_what_the_cluster_has() -> None:
    with pytest.raises(ServePreflightError) as caught:
        check_resources(SGLANG_TP8, ServeOptions(), say=print, nodes=lambda: _nodes((4, 8), (4, 8)))
    message = str(caught.value)
    assert "each replica needs 8 GPUs (tp_size) and 1 CPU (serve.cpus_per_replica) on one node" in message, message
    assert "x 1 replica (the default)" in message and "the cluster has 8 GPUs and 16 CPUs in 2 nodes" in message
    assert "the largest node: 4 GPUs, 8 CPUs" in message and "room for 0 replicas" in message
    assert "--wait-for-resources SECONDS" in message and "--gpus-per-replica" in message


def test_replicas_count_and_cpus_count_too() -> None:
    two = ServeOptions(num_replicas=2, gpus_per_replica=1)
    note = check_resources(REFERENCE, two, say=print, nodes=lambda: _nodes((1, 4), (1, 4)))
    assert "2 replicas of 1 GPU and 1 CPU each" in note
    with pytest.raises(ServePreflightError, match=r"x 2 replicas \(serve.num_replicas\).*room for 1 replica\b"):
        check_resources(REFERENCE, two, say=print, nodes=lambda: _nodes((2, 1)))  # 2 GPUs but 1 CPU
    scaled = ServeOptions(autoscaling_config={"min_replicas": 3, "max_replicas": 6}, cpus_per_replica=2)
    with pytest.raises(ServePreflightError, match=r"0 GPUs \(the reference engine's default\) and 2 CPUs.*x 3 "
                                                  r"replicas \(serve.autoscaling_config\)"):
        check_resources(REFERENCE, scaled, say=print, nodes=lambda: _nodes((0, 4)))


def test_waiting_for_resources_sees_a_node_join_and_gives_up_after_the_wait() -> None:
    looks = []

    def joining() -> list[dict[str, float]]:
        looks.append(1)
        return _nodes((0, 2)) if len(looks) < 3 else _nodes((0, 2), (8, 8))

    note = check_resources(SGLANG_TP8, ServeOptions(), wait_s=30, poll_s=0.01, say=print, nodes=joining)
    assert len(looks) == 3 and "1 replica of 8 GPUs" in note
    began = time.monotonic()
    with pytest.raises(ServePreflightError, match=r"gave up after waiting 0 s \(--wait-for-resources 0.2\)"):
        check_resources(SGLANG_TP8, ServeOptions(), wait_s=0.2, poll_s=0.01, say=print, nodes=lambda: _nodes((0, 2)))
    assert time.monotonic() - began < 5


def test_an_unknown_preset_is_refused_naming_the_presets() -> None:
    with pytest.raises(ServePreflightError) as caught:
        check_engine_here(EngineConfig(kind="reference", model_path="ref-huge", tp_size=1))
    message = str(caught.value)
    assert message.startswith("model_path: --model-path 'ref-huge' is not a reference-engine preset") and \
        "ref-tiny" in message, message


def test_sglang_paths_a_missing_local_one_and_an_uncached_hub_id_are_refused(tmp_path) -> None:
    missing = tmp_path / "no-such-model"
    cache = tmp_path / "hf"
    found = engine_problems(kind="sglang", model_path=str(missing), draft_path="org/draft",
                            fields={"kind": "kind", "model": "model_path", "draft": "speculative_draft_model_path"},
                            env={"HF_HUB_CACHE": str(cache)})
    problems = "\n".join(found["problems"])
    assert f"model_path: {missing} does not exist on node" in problems, found
    assert (f"speculative_draft_model_path: 'org/draft' is a Hugging Face hub id and is not in the Hugging Face "
            f"cache at {cache} on node") in problems, found
    assert f"Download it first on every node that runs engines: HF_HUB_CACHE={cache} hf download org/draft" in problems
    present = engine_problems(kind="sglang", model_path=str(tmp_path), draft_path=None)
    assert not any("does not exist" in p for p in present["problems"]), present


def test_stop_leftovers_stops_what_outlived_the_shutdown_and_waits_for_what_exits() -> None:
    """A leftover is SIGTERMed; one that ignores SIGTERM is SIGKILLed; both are reported."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stubborn = subprocess.Popen([sys.executable, "-c", "import signal, sys, time; signal.signal(signal.SIGTERM, "
                                 "signal.SIG_IGN); sys.stdout.write('ready\\n'); sys.stdout.flush(); time.sleep(60)"],
                                stdout=subprocess.PIPE)
    try:
        assert stubborn.stdout.readline() == b"ready\n"  # its SIGTERM handler is in place
        procs = [psutil.Process(p.pid) for p in (sleeper, stubborn)]
        stopped = stop_leftovers(procs, exit_s=0.2, kill_s=1.0)
        assert sorted(int(s.split()[0]) for s in stopped) == sorted([sleeper.pid, stubborn.pid]), stopped
        assert sleeper.wait(timeout=10) == -signal.SIGTERM and stubborn.wait(timeout=10) == -signal.SIGKILL
    finally:
        for proc in (sleeper, stubborn):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
