"""The kernel of decode's all-reduce, read from a running reference engine as the sweep reads SGLang:
``/server_info`` and the per-rank log (``serving.engine.all_reduce_observed``), for engines started
from a spec's arms on a declared node, with the sweep's own command builder."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.spec import SweepSpec
from orchestrator.bench.control import server_info
from serving.engine.all_reduce_observed import observe_all_reduce
from serving.engine.command import build_command
from serving.engine.process import EngineProcess
from serving.ports import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

KIMI = "KimiK25ForConditionalGeneration"


def _spec(gpu_kind: str, tp: int) -> SweepSpec:
    return SweepSpec.from_dict({
        "name": "arms", "engine": {"kind": "reference", "model_path": "ref-tiny", "draft_model_path": "ref-tiny-draft",
                                   "tp_size": tp, "gpu_kind": gpu_kind, "architecture": KIMI},
        "search": {"all_reduce": ["default", "no_fusion", "nccl"]}, "benchmark": {"concurrency": [1]},
    })


def _observed(spec: SweepSpec, arm: str, tmp_path: Path):
    config = spec.engine_config(num_steps=None, eagle_topk=None, num_draft_tokens=None, all_reduce=arm)
    command = build_command(config, port=free_port())
    engine = EngineProcess(command=command, log_path=tmp_path / f"{arm}.log", start_timeout_s=120)
    with engine:
        info = server_info(command.url)
        log = engine.log_path.read_text(errors="replace")
    return observe_all_reduce(server_info=info, log_text=log, tp_size=spec.engine.tp_size), info, log


def test_a_kimi_like_model_on_a_declared_h200_node_runs_fusion_custom_or_nccl_by_arm(tmp_path: Path) -> None:
    spec = _spec("sm90-nvlink", tp=2)
    default, info, log = _observed(spec, "default", tmp_path)
    assert default.kernel == "flashinfer_fusion", default
    assert info["flashinfer_allreduce_fusion_backend"] == "auto" and info["reference_gpu_kind"] == "sm90-nvlink"
    assert f"Auto-enabling FlashInfer AllReduce Fusion (auto) for {KIMI}" in log  # SGLang's own line
    no_fusion, info, log = _observed(spec, "no_fusion", tmp_path)
    assert no_fusion.kernel == "custom_all_reduce" and info["flashinfer_allreduce_fusion_backend"] is None
    assert "FlashInfer allreduce fusion is forcibly disabled" in log and no_fusion.ranks_in_log == [0, 1]
    nccl, info, _ = _observed(spec, "nccl", tmp_path)
    assert nccl.kernel == "nccl" and info["disable_custom_all_reduce"] is True


def test_on_a_declared_pcie_node_every_rank_logs_custom_all_reduce_off_and_nccl_carries_decode(tmp_path: Path) -> None:
    spec = _spec("sm120-pcie", tp=4)  # more than two PCIe-only GPUs: the rule of the seed's 8-GPU node
    assert spec.arms_on_node().measured == ("default",)
    observed, info, log = _observed(spec, "default", tmp_path)
    assert observed.kernel == "nccl" and observed.ranks_custom_off == [0, 1, 2, 3], observed
    assert info["flashinfer_allreduce_fusion_backend"] is None  # sm120: no fusion
    assert log.count("not supported on more than two PCIe-only GPUs") == 4
