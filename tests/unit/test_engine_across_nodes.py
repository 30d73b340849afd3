"""One engine across nodes, the parts that need no cluster: SGLang's flags in the command, the
placement (a bundle per node, STRICT_SPREAD), the spec's rules, the preflight's fit and the audit
merged over nodes."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from orchestrator.spec import SweepSpec
from serving.engine.command import DIST_INIT_ADDR_AT_LAUNCH, build_command
from serving.engine.config import EngineConfig
from serving.engine.group import merge_audits, node_words
from serving.engine.placement import engine_placement, placements_that_fit
from serving.engine.process import EngineProcess


def _config(**kw: object) -> EngineConfig:
    return EngineConfig(kind="sglang", model_path="m", **{"tp_size": 16, "nnodes": 2, **kw})  # type: ignore[arg-type]


def _flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_each_node_runs_sglangs_multi_node_flags() -> None:
    argv = build_command(_config(), port=30000, node_rank=1, dist_init_addr="10.0.0.1:5000").argv
    assert (_flag(argv, "--nnodes"), _flag(argv, "--node-rank"), _flag(argv, "--dist-init-addr")) == (
        "2", "1", "10.0.0.1:5000")
    assert _flag(argv, "--tp-size") == "16"  # tp spans the nodes: SGLang's tp_size is the whole engine's
    single = build_command(EngineConfig(kind="sglang", model_path="m", tp_size=8), port=30000).argv
    assert "--nnodes" not in single and "--node-rank" not in single and "--dist-init-addr" not in single


def test_a_shown_command_says_the_address_is_chosen_at_launch_but_a_launch_needs_one(tmp_path) -> None:
    assert _flag(build_command(_config(), port=1).argv, "--dist-init-addr") == DIST_INIT_ADDR_AT_LAUNCH
    with pytest.raises(ValueError, match="dist_init_addr"):
        EngineProcess.from_config(_config(), log_dir=tmp_path)
    with pytest.raises(ValueError, match="node_rank=2"):
        build_command(_config(), port=1, node_rank=2, dist_init_addr="a:1")


def test_tp_must_split_over_the_nodes_and_the_launch_flags_are_not_extra_args() -> None:
    with pytest.raises(ValidationError, match="nnodes: 2 does not divide tp_size=3"):
        _config(tp_size=3)
    for flag in ("nnodes", "node_rank", "dist_init_addr", "nccl_init_addr"):
        with pytest.raises(ValidationError, match="set by spectune"):
            EngineConfig(kind="sglang", model_path="m", extra_args={flag: "1"})


def test_placement_is_a_bundle_per_node_spread() -> None:
    one = engine_placement(gpus=8, cpus=4)
    assert (one.bundles, one.strategy, one.host_bundles) == (({"CPU": 4.0}, {"GPU": 8.0}), "STRICT_PACK", (1,))
    two = engine_placement(gpus=16, cpus=4, nnodes=2)
    assert two.bundles == ({"CPU": 4.0, "GPU": 8.0}, {"GPU": 8.0}) and two.strategy == "STRICT_SPREAD"
    assert two.host_bundles == (0, 1) and two.gpus_per_node == 8
    cpu = engine_placement(gpus=0, cpus=1, nnodes=2)
    assert cpu.bundles == ({"CPU": 1.0}, {"CPU": 1.0}), "no empty bundle: the engine's own CPU"
    with pytest.raises(ValueError, match="split evenly"):
        engine_placement(gpus=3, cpus=1, nnodes=2)


def _spec(**engine: object) -> dict:
    return {"name": "t", "engine": {"kind": "sglang", "model_path": "m", "draft_model_path": "d", **engine}}


def test_the_spec_takes_nnodes_and_its_trials_span_the_nodes() -> None:
    spec = SweepSpec.from_dict(_spec(tp_size=16, nnodes=2))
    assert spec.trial_placement.nnodes == 2 and spec.trial_placement.gpus_per_node == 8
    config = spec.engine_config(num_steps=3, eagle_topk=1, num_draft_tokens=4)
    assert config.nnodes == 2 and config.ranks_per_node == 8
    with pytest.raises(ValueError, match="engine.nnodes: 3 does not divide engine.tp_size=16"):
        SweepSpec.from_dict(_spec(tp_size=16, nnodes=3))
    with pytest.raises(ValueError, match="use engine.nnodes instead"):
        SweepSpec.from_dict(_spec(tp_size=16, extra_args={"nnodes": 2}))


def test_the_preflight_needs_a_node_per_bundle() -> None:
    placement = engine_placement(gpus=16, cpus=4, nnodes=2)
    node = {"CPU": 8.0, "GPU": 8.0}
    assert placements_that_fit([node, dict(node)], placement) == 1
    assert placements_that_fit([{"CPU": 8.0, "GPU": 16.0}], placement) == 0, "one big node is not two nodes"
    assert placements_that_fit([node, {"CPU": 8.0, "GPU": 4.0}], placement) == 0
    assert placements_that_fit([{"CPU": 8.0, "GPU": 16.0}], engine_placement(gpus=16, cpus=4)) == 1
    assert placements_that_fit([{"CPU": 8.0, "GPU": 16.0}] * 2, placement, most=5) == 2, "each copy on both nodes"
    assert placements_that_fit([node] * 4, placement, most=5) == 2


def _audit(ok: bool, pid: int) -> dict:
    return {"ok": ok, "summary": "env audit passed" if ok else "env audit FAILED for 1 of 2 processes",
            "root_pid": pid, "expected": {"NCCL_ALGO": "Ring"}, "worker_expected": {},
            "processes": [{"pid": pid, "role": "server", "ok": True}, {"pid": pid + 1, "role": "tp_worker", "ok": ok}]}


def test_the_audit_of_an_engine_across_nodes_is_every_nodes() -> None:
    nodes = [{"node_rank": 0, "node_id": "aa", "node_ip": "10.0.0.1"}, {"node_rank": 1, "node_id": "bb",
                                                                        "node_ip": "10.0.0.2"}]
    merged = merge_audits([_audit(True, 100), _audit(True, 200)], nodes)
    assert merged["ok"] and merged["summary"].startswith("env audit passed on all 2 nodes")
    assert [(p["pid"], p["node_rank"]) for p in merged["processes"]] == [(100, 0), (101, 0), (200, 1), (201, 1)]
    failed = merge_audits([_audit(True, 100), _audit(False, 200)], nodes)
    assert not failed["ok"] and "FAILED on 1 of 2 nodes" in failed["summary"]
    assert "node rank 1 (10.0.0.2, node bb): env audit FAILED" in failed["summary"]
    assert node_words(nodes[1]) == "node rank 1 (10.0.0.2, node bb)"


def test_a_node_runs_a_rank_if_it_holds_its_part_of_the_group() -> None:
    assert engine_placement(gpus=8, cpus=4).rank_node_need() == {"CPU": 4.0, "GPU": 8.0}, "packed: all of it"
    assert engine_placement(gpus=16, cpus=4, nnodes=2).rank_node_need() == {"GPU": 8.0}, "spread: a node's GPUs"
    assert engine_placement(gpus=0, cpus=1, nnodes=2).rank_node_need() == {"CPU": 1.0}
