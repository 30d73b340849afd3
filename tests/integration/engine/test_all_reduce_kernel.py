"""The kernel of decode's all-reduce, read from a running reference engine as the sweep reads SGLang:
``/server_info`` and the per-rank log (``serving.engine.all_reduce_observed``), for engines started
from a spec's arms on a declared node, with the sweep's own command builder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.space import ARM_MULTICAST
from orchestrator.spec import SweepSpec
from orchestrator.bench.control import server_info
from serving.engine.all_reduce_observed import observe_all_reduce
from serving.engine.command import build_command
from serving.engine.process import EngineLaunchError, EngineProcess
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
    spec = _spec("sm120-pcie", tp=4)  # more than two PCIe-only GPUs: the rule of 8x RTX PRO 6000 (PCIe)
    assert spec.arms_on_node().measured == ("default",)
    observed, info, log = _observed(spec, "default", tmp_path)
    assert observed.kernel == "nccl" and observed.ranks_custom_off == [0, 1, 2, 3], observed
    assert info["flashinfer_allreduce_fusion_backend"] is None  # sm120: no fusion
    # CustomAllReduceV2 declines first (it needs NVLink), then the legacy class: each rank logs both
    assert log.count("CustomAllReduceV2 is disabled because it's not supported on more than two PCIe-only GPUs") == 4
    assert log.count("CustomAllreduce is disabled because it's not supported on more than two PCIe-only GPUs") == 4


# --- the opt-in paths' arms (issue 44): where each engages, where not, and arms that resolve alike ---------

def _opt_in_spec(gpu_kind: str, tp: int, arms: list[str], *, mscclpp_installed: bool = False,
                 architecture: str = "LlamaForCausalLM") -> SweepSpec:
    """A spec searching ``arms`` on a declared node; a dense model, so SGLang turns no fusion on by itself."""
    return SweepSpec.from_dict({
        "name": "opt-in", "engine": {"kind": "reference", "model_path": "ref-tiny", "draft_model_path": "ref-tiny-draft",
                                     "tp_size": tp, "gpu_kind": gpu_kind, "architecture": architecture,
                                     "mscclpp_installed": mscclpp_installed},
        "search": {"all_reduce": arms, "allow_dangerous": [a for a in arms if a in ARM_MULTICAST]},
        "benchmark": {"concurrency": [1]},
    })


def _planned_and_observed(spec: SweepSpec, arm: str, tmp_path: Path) -> tuple[str, Any, str]:
    observed, info, log = _observed(spec, arm, tmp_path)
    return spec.arms_on_node().paths[arm].kernel, observed, log


@pytest.mark.parametrize(("gpu_kind", "arm", "kernel", "backend"), [
    ("sm90-nvlink", "fusion_trtllm", "flashinfer_fusion", "trtllm"),
    ("sm90-nvlink", "fusion_mnnvl", "flashinfer_fusion", "mnnvl"),
    ("sm100-nvlink", "fusion_cutedsl", "flashinfer_fusion", "cutedsl"),  # Blackwell only
    ("sm90-nvlink", "torch_symm_mem", "torch_symm_mem", None),
    ("sm90-nvlink", "nccl_symm_mem", "nccl_symm_mem", None),
])
def test_on_a_declared_nvlink_node_each_opt_in_arm_engages_and_the_engine_shows_it(
        gpu_kind: str, arm: str, kernel: str, backend: str | None, tmp_path: Path) -> None:
    spec = _opt_in_spec(gpu_kind, 2, ["default", arm])  # a dense model: default is custom all-reduce
    assert spec.arms_on_node().measured == ("default", arm)
    predicted, observed, log = _planned_and_observed(spec, arm, tmp_path)
    assert predicted == observed.kernel == kernel and observed.fusion_backend == backend, observed
    assert "TorchSymmMemCommunicator" not in log and "CustomAllreduce is disabled" not in log


def test_on_a_cpu_node_nccl_symmetric_memory_is_plain_gloo_like_every_arm(tmp_path: Path) -> None:
    spec = _opt_in_spec("cpu", 2, ["default", "nccl_symm_mem"])
    assert spec.arms_on_node().stands_for["nccl_symm_mem"] == "default"
    predicted, observed, _ = _planned_and_observed(spec, "nccl_symm_mem", tmp_path)
    assert predicted == observed.kernel == "nccl", observed


def test_mscclpp_engages_only_where_the_package_is_installed_and_the_world_size_has_an_algorithm(tmp_path: Path) -> None:
    installed = _opt_in_spec("sm90-nvlink", 4, ["default", "mscclpp"], mscclpp_installed=True)
    assert installed.arms_on_node().measured == ("default", "mscclpp")
    predicted, observed, log = _planned_and_observed(installed, "mscclpp", tmp_path)
    assert predicted == observed.kernel == "mscclpp" and log.count("Created MSCCL++ communicator") == 4, observed
    absent = _opt_in_spec("sm90-nvlink", 4, ["default", "mscclpp"])  # SGLang 0.5.23 does not install mscclpp
    assert absent.arms_on_node().stands_for["mscclpp"] == "default"
    (tmp_path / "absent").mkdir()
    predicted, observed, log = _planned_and_observed(absent, "mscclpp", tmp_path / "absent")
    assert predicted == observed.kernel == "custom_all_reduce", observed
    assert log.count("PyMscclpp is unavailable because its dependencies failed to import") == 4


def test_on_a_declared_pcie_node_the_symmetric_memory_and_mscclpp_arms_resolve_alike_and_are_measured_once(
        tmp_path: Path) -> None:
    spec = _opt_in_spec("sm120-pcie", 2, ["default", "torch_symm_mem", "mscclpp", "nccl_symm_mem"],
                        mscclpp_installed=True)
    plan = spec.arms_on_node()
    # two PCIe GPUs: custom all-reduce engages; torch symmetric memory has no sm120 table, MSCCL++ no
    # algorithm at world size 2, so those arms fall back as the rule says; NCCL's symmetric memory differs
    assert plan.measured == ("default", "torch_symm_mem", "nccl_symm_mem") and plan.stands_for["mscclpp"] == "default"
    assert plan.paths["torch_symm_mem"].kernel == "nccl"
    assert plan.paths["default"].kernel == "custom_all_reduce"  # two PCIe GPUs: mscclpp's engine must run it too
    for arm, kernel in (("mscclpp", "custom_all_reduce"), ("torch_symm_mem", "nccl")):
        predicted, observed, log = _planned_and_observed(spec, arm, tmp_path)
        assert predicted == observed.kernel == kernel, (arm, observed)
    assert "TorchSymmMemCommunicator: Device capability 12 not supported" in log


@pytest.mark.parametrize(("gpu_kind", "arm", "message"), [
    ("sm120-pcie", "fusion_trtllm", "FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs."),
    ("sm120-pcie", "fusion_mnnvl", "FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs."),
    ("sm90-nvlink", "fusion_cutedsl", "FlashInfer allreduce fusion cutedsl backend requires a Blackwell system."),
])
def test_a_fusion_backend_sglang_refuses_on_the_node_is_left_out_and_the_engine_refuses_it_too(
        gpu_kind: str, arm: str, message: str, tmp_path: Path) -> None:
    spec = _opt_in_spec(gpu_kind, 2, ["default", arm])
    plan = spec.arms_on_node()
    assert plan.measured == ("default",) and message in plan.refused[arm]
    with pytest.raises(EngineLaunchError) as failed:
        _observed(spec, arm, tmp_path)
    assert message in failed.value.log_tail


# --- FlashInfer's PCIe-IPC all-reduce (issue 56): the workspace line, not the construction line, is proof ------

def test_pcie_ipc_is_observed_once_every_rank_built_its_workspace_and_nccl_when_the_build_fails(tmp_path: Path) -> None:
    spec = _opt_in_spec("sm120-pcie", 2, ["default", "pcie_ipc"])
    assert spec.arms_on_node().paths["pcie_ipc"].kernel == "pcie_ipc"  # two PCIe GPUs: the arm turns custom off
    config = spec.engine_config(num_steps=None, eagle_topk=None, num_draft_tokens=None, all_reduce="pcie_ipc")
    assert config.env["SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"] == "1"
    for fault, kernel in (("", "pcie_ipc"), ("pcie_ipc_build_fails", "nccl")):
        command = build_command(config.model_copy(update={"env": {**config.env, "SPECTUNE_REFERENCE_FAULT": fault}}),
                                port=free_port())
        engine = EngineProcess(command=command, log_path=tmp_path / f"pcie-{fault or 'ok'}.log", start_timeout_s=120)
        with engine:  # healthy: /health_generate has run a forward pass, so the first reduction is behind us
            info = server_info(command.url)
            log = engine.log_path.read_text(errors="replace")
        assert log.count("FlashInfer PCIe-IPC all-reduce enabled (world=2") == 2, log[-3000:]
        observed = observe_all_reduce(server_info=info, log_text=log, tp_size=2)
        assert observed.kernel == kernel, (observed, log[-3000:])
        built, failed = log.count("FlashInfer PCIe-IPC workspace built (world=2"), log.count("reductions stay on NCCL")
        assert (built, failed) == ((0, 2) if fault else (2, 0)), log[-3000:]
        if not fault:  # the same log up to the first workspace line: every rank said "enabled", and that is no proof
            start = log[:log.index("FlashInfer PCIe-IPC workspace built")]
            assert observe_all_reduce(server_info=info, log_text=start, tp_size=2).kernel == "nccl"
