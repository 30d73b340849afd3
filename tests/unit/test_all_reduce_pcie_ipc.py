"""FlashInfer's PCIe-IPC all-reduce as an arm (issue 56): SGLang 0.5.23's rule for it
(``serving.all_reduce_rules``), the arm's environment and how a spec may not set it by hand, the
engine's lines read back (``serving.engine.all_reduce_observed``), the reference engine's stand-in
and fault, and its first start in the night plan. With the drift fixes of the same issue: custom
all-reduce V2's world sizes and lines, attention DP read from ``attn_dp_size``, and the DeepSeek-V4.1
exception to fusion stated."""

from __future__ import annotations

import copy
import logging
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.space import ARM_ENV, Candidate, SpeculativeTriple, arm_env, arm_flags
from orchestrator.spec import SpecError, SweepSpec
from orchestrator.sweep.output.cost import PCIE_IPC_FIRST_START_S
from orchestrator.sweep.output.night_plan import night_plan, plan_lines
from serving.all_reduce_rules import (
    PCIE_IPC_BUILT,
    PCIE_IPC_ENABLED,
    PCIE_IPC_FAILED,
    PCIE_IPC_NO_MODULE,
    GpuKind,
    attention_dp_of,
    custom_all_reduce_off_lines,
    decode_kernel,
    engages,
    opt_in_rank_lines,
    pcie_ipc_switched_on,
    predict,
)
from serving.engine.all_reduce_observed import observe_all_reduce
from serving.reference.faults import parse_faults
from serving.reference.parallel import PcieIpcStandIn, SingleRank

KIMI = "KimiK25ForConditionalGeneration"
LLAMA = "LlamaForCausalLM"
EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
RTX = EXPERIMENTS / "kimi-k2.5-eagle3-8x-rtx-pro-6000.yaml"
H200 = EXPERIMENTS / "kimi-k2.5-eagle3-8x-h200.yaml"
VAR = "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"


def _kernel(kind: str, tp: int = 8, arch: str = KIMI, **flags) -> str:
    return decode_kernel(gpu_kind=GpuKind.parse(kind), architecture=arch, tp_size=tp, **flags)[0]


def _spec(kind: str, arms: list[str], *, tp: int = 8, arch: str = KIMI, env: dict | None = None) -> SweepSpec:
    return SweepSpec.from_dict({
        "name": "pcie", "engine": {"kind": "sglang", "model_path": "org/model", "draft_model_path": "org/draft",
                                   "tp_size": tp, "gpu_kind": kind, "architecture": arch, "env": env or {}},
        "search": {"all_reduce": arms}, "benchmark": {"concurrency": [1]},
    })


# --- the rule -------------------------------------------------------------------------------------------

def test_on_eight_pcie_gpus_the_variable_puts_decode_on_pcie_ipc_and_without_it_nccl() -> None:
    assert _kernel("sm120-pcie", enable_pcie_ipc=True) == "pcie_ipc"
    assert _kernel("sm120-pcie") == "nccl"
    plan = _spec("sm120-pcie", ["default", "pcie_ipc"]).arms_on_node()
    assert plan.paths["pcie_ipc"].kernel == "pcie_ipc" and plan.measured == ("default", "pcie_ipc")
    assert plan.nccl_arms == ("default",), "its kernel is FlashInfer's: NCCL's variables are not searched on it"


@pytest.mark.parametrize(("kind", "tp", "arch", "flags", "kernel"), [
    ("sm90-nvlink", 8, KIMI, {}, "flashinfer_fusion"),  # fusion runs at the RMSNorm call site, first
    ("sm90-nvlink", 8, LLAMA, {}, "custom_all_reduce"),  # custom all-reduce ranks ahead of it
    ("sm90-nvlink", 8, LLAMA, {"disable_custom_all_reduce": True}, "pcie_ipc"),  # it does not probe NVLink
    ("sm120-pcie", 2, KIMI, {}, "custom_all_reduce"),  # two PCIe GPUs: the legacy custom all-reduce takes decode
    ("sm120-pcie", 2, KIMI, {"disable_custom_all_reduce": True}, "pcie_ipc"),  # ... hence the arm's flag
    ("sm120-pcie", 6, KIMI, {}, "nccl"),  # world sizes 2, 4, 8 only
    ("sm120-pcie", 8, KIMI, {"deterministic": True}, "nccl"),  # off under deterministic inference
    ("sm120-pcie", 8, KIMI, {"activation_dtype": "float16"}, "nccl"),  # bf16 only
    ("sm120-pcie", 8, KIMI, {"enable_symm_mem": True}, "nccl_symm_mem"),  # NCCL symmetric memory ranks ahead
    ("cpu", 2, KIMI, {}, "nccl"),
])
def test_where_pcie_ipc_ranks(kind: str, tp: int, arch: str, flags: dict, kernel: str) -> None:
    assert _kernel(kind, tp, arch, enable_pcie_ipc=True, **flags) == kernel


def test_across_nodes_pcie_ipc_is_not_assumed_and_engages_says_what_ranks_ahead() -> None:
    assert _kernel("sm120-pcie", 16, enable_pcie_ipc=True, nnodes=2) == "nccl"
    ok, why = engages("pcie_ipc", gpu_kind=GpuKind.parse("sm90-nvlink"), world_size=8, architecture=LLAMA)
    assert not ok and "custom all-reduce ranks ahead" in why
    assert engages("pcie_ipc", gpu_kind=GpuKind.parse("sm120-pcie"), world_size=8)[0]


def test_the_arm_is_its_variable_and_the_custom_all_reduce_switch() -> None:
    assert ARM_ENV["pcie_ipc"] == {VAR: "1"} and arm_env("default") == {}
    assert arm_flags("pcie_ipc") == {"disable_custom_all_reduce": True,
                                     "enforce_disable_flashinfer_allreduce_fusion": False}
    spec = _spec("sm120-pcie", ["default", "pcie_ipc"], env={"NCCL_DEBUG": "WARN"})
    config = Candidate(SpeculativeTriple(None, None, None), "pcie_ipc", {}).applied_to(spec.engine.template())
    assert config.env == {"NCCL_DEBUG": "WARN", VAR: "1"}, "the env audit expects what the engine's env holds"
    assert pcie_ipc_switched_on({VAR: "yes"}) and not pcie_ipc_switched_on({VAR: "0"}) and not pcie_ipc_switched_on({})
    with pytest.raises(ValueError, match="not a valid boolean"):
        pcie_ipc_switched_on({VAR: "maybe"})


def test_on_an_nvlink_node_the_arm_runs_fusion_and_is_measured_as_default() -> None:
    plan = _spec("sm90-nvlink", ["pcie_ipc", "default"]).arms_on_node()
    assert plan.stands_for["pcie_ipc"] == "default" and plan.measured == ("default",)


def test_the_variable_set_by_hand_in_engine_env_is_refused_naming_the_arm() -> None:
    with pytest.raises(SpecError) as info:
        _spec("sm120-pcie", ["default"], env={VAR: "1"})
    text = str(info.value)
    assert f"engine.env.{VAR}: '1'" in text and "search.all_reduce: [pcie_ipc" in text, text


def test_engine_cmd_prints_the_variable_in_the_env() -> None:
    result = CliRunner().invoke(app, ["engine-cmd", str(RTX), "--set", "all_reduce=pcie_ipc"])
    assert result.exit_code == 0, result.output
    command = next(line for line in result.output.splitlines() if "sglang.launch_server" in line)
    assert f"{VAR}=1 " in command.split("python")[0] and "--disable-custom-all-reduce" in command
    as_json = CliRunner().invoke(app, ["engine-cmd", str(RTX), "--set", "all_reduce=pcie_ipc", "--json"])
    assert f'"{VAR}": "1"' in as_json.output


# --- reading the engine -----------------------------------------------------------------------------------

def _log(lines: list[str]) -> str:
    return "\n".join(f"[2026-12-10 10:00:00 {line}" for line in lines)


PCIE_OFF = "CustomAllreduce is disabled because it's not supported on more than two PCIe-only GPUs. To silence ..."
INFO = {"flashinfer_allreduce_fusion_backend": None, "disable_custom_all_reduce": True, "device": "cuda"}


def test_pcie_ipc_is_observed_only_where_every_rank_built_its_workspace() -> None:
    enabled = [f"TP{r}] INFO x: {PCIE_IPC_ENABLED % 4}" for r in range(4)]
    built = [f"TP{r}] INFO x: {PCIE_IPC_BUILT % (4, 192 * 64, 64)}" for r in range(4)]
    assert observe_all_reduce(server_info=INFO, log_text=_log(enabled), tp_size=4).kernel == "nccl"
    seen = observe_all_reduce(server_info=INFO, log_text=_log(enabled + built), tp_size=4)
    assert seen.kernel == "pcie_ipc" and "4 ranks" in seen.evidence, seen
    assert observe_all_reduce(server_info=INFO, log_text=_log(enabled + built[:3]), tp_size=4).kernel == "nccl"


@pytest.mark.parametrize("fallback", [PCIE_IPC_FAILED % (12288, "boom"), PCIE_IPC_NO_MODULE,
                                      "Setup FlashInfer PCIe-IPC allreduce failed with boom."])
def test_a_failure_or_fallback_line_on_any_rank_is_nccl(fallback: str) -> None:
    built = [f"TP{r}] INFO x: {PCIE_IPC_BUILT % (2, 12288, 64)}" for r in range(2)]
    seen = observe_all_reduce(server_info=INFO, log_text=_log(built + [f"TP1] WARNING x: {fallback}"]), tp_size=2)
    assert seen.kernel == "nccl" and "falling back" in seen.evidence, seen


def test_a_built_workspace_behind_custom_all_reduce_or_symmetric_memory_is_not_pcie_ipc() -> None:
    built = _log([f"TP{r}] INFO x: {PCIE_IPC_BUILT % (2, 12288, 64)}" for r in range(2)])
    custom_on = {**INFO, "disable_custom_all_reduce": False}  # SGLang builds the workspace at warm-up regardless
    assert observe_all_reduce(server_info=custom_on, log_text=built, tp_size=2).kernel == "custom_all_reduce"
    symm = {**INFO, "enable_symm_mem": True}
    assert observe_all_reduce(server_info=symm, log_text=built, tp_size=2).kernel == "nccl_symm_mem"


# --- the reference engine ---------------------------------------------------------------------------------

def test_every_rank_says_pcie_ipc_is_enabled_at_start_where_sglang_builds_it() -> None:
    node = GpuKind.parse("sm120-pcie")
    assert opt_in_rank_lines(gpu_kind=node, world_size=8, enable_pcie_ipc=True) == [("info", PCIE_IPC_ENABLED % 8)]
    assert opt_in_rank_lines(gpu_kind=node, world_size=6, enable_pcie_ipc=True) == []  # a DEBUG line only
    assert "Deterministic" in opt_in_rank_lines(gpu_kind=node, world_size=8, enable_pcie_ipc=True,
                                                deterministic=True)[0][1]
    assert opt_in_rank_lines(gpu_kind=GpuKind.parse("cpu"), world_size=2, enable_pcie_ipc=True) == []


def test_the_stand_in_logs_the_workspace_at_the_first_reduction_or_the_faults_failure(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="serving.reference.parallel")
    comm = PcieIpcStandIn(SingleRank(), max_rows=48 * 4, max_numel=0)
    assert not caplog.records, "nothing before the first reduction"
    comm.all_reduce(torch.zeros(3, 64))
    comm.all_reduce(torch.zeros(3, 64))
    assert [r.getMessage() for r in caplog.records] == [PCIE_IPC_BUILT % (1, 48 * 4 * 64, 64)]
    caplog.clear()
    failing = PcieIpcStandIn(SingleRank(), max_rows=8, max_numel=4096, fail=True)
    failing.all_reduce(torch.zeros(1, 64))
    assert [r.getMessage() for r in caplog.records] == [
        PCIE_IPC_FAILED % (4096, "fault pcie_ipc_build_fails: the workspace build raised")]
    assert parse_faults("pcie_ipc_build_fails").pcie_ipc_build_fails
    assert str(parse_faults("pcie_ipc_build_fails")) == "pcie_ipc_build_fails"


# --- the night --------------------------------------------------------------------------------------------

def test_the_rtx_dry_run_starts_pcie_ipc_first_and_counts_its_first_start_once() -> None:
    result = CliRunner().invoke(app, ["sweep", "--dry-run", "--first", "1", str(RTX)])
    assert result.exit_code == 0, result.output
    flat = " ".join(result.output.split())
    # the cold first start (assumed: twice a warm one) comes before them all
    assert "first started: pcie_ipc at 1h00m, nccl_symm_mem at 1h16m" in flat, flat
    assert "trial 5 adds 3m00s once (pcie_ipc's first start: assumed" in flat
    assert "7h16m end at max_visits: fits budget.time_limit_s (8h00m)" in flat
    plan = night_plan(SweepSpec.from_yaml(RTX))
    assert [(n, s) for n, s, _ in plan.extras] == [(5, PCIE_IPC_FIRST_START_S)]
    assert plan.trial_at_s(6) - plan.trial_at_s(5) == pytest.approx(plan.trial_s + PCIE_IPC_FIRST_START_S)


def test_no_first_start_extra_where_the_arm_runs_another_arms_kernel() -> None:
    data = yaml.safe_load(RTX.read_text())
    data["engine"]["gpu_kind"] = "sm90-nvlink"  # fusion takes decode: the arm is measured as default
    data["search"]["allow_dangerous"].append("nccl_symm_mem")  # NVLink: its multicast must be allowed by name
    plan = night_plan(SweepSpec.from_dict(copy.deepcopy(data)))
    assert plan.extras == () and not any("'s first start" in line for line in plan_lines(plan))


# --- drift: custom all-reduce V2, attention DP, DeepSeek-V4.1 ---------------------------------------------

def test_custom_all_reduce_v2_first_then_the_legacy_class_each_with_its_line() -> None:
    lines = custom_all_reduce_off_lines(gpu_kind=GpuKind.parse("sm120-pcie"), world_size=8)
    assert [line.split(" is disabled")[0] for line in lines] == ["CustomAllReduceV2", "CustomAllreduce"]
    assert all("more than two PCIe-only GPUs" in line for line in lines)
    for kind, ws in (("sm90-nvlink", 3), ("sm90-nvlink", 7), ("sm100-nvlink", 16), ("sm80-nvlink", 12),
                     ("sm120-pcie", 2)):  # V2 on NVLink (sm90 2-8; sm100 2-8, 16; others 2-16); PCIe TP2: legacy
        assert custom_all_reduce_off_lines(gpu_kind=GpuKind.parse(kind), world_size=ws) == [], (kind, ws)
    three = custom_all_reduce_off_lines(gpu_kind=GpuKind.parse("sm120-pcie"), world_size=3)
    assert "CustomAllReduceV2 is disabled because it's not supported" in three[0]
    assert "CustomAllreduce is disabled due to an unsupported world size: 3" in three[1]
    # across nodes a declared kind cannot tell one NVLink clique: assumed not, the legacy class says so
    assert custom_all_reduce_off_lines(gpu_kind=GpuKind.parse("sm100-nvlink"), world_size=16, nnodes=2) == [
        "CustomAllreduce is disabled because this process group spans across nodes."]


def test_attention_dp_is_attn_dp_size_so_the_h200_spec_then_predicts_no_fusion() -> None:
    data = yaml.safe_load(H200.read_text())
    assert SweepSpec.from_dict(copy.deepcopy(data)).arms_on_node().paths["default"].kernel == "flashinfer_fusion"
    data["engine"]["extra_args"] = {**data["engine"].get("extra_args", {}), "attn_dp_size": 8}
    plan = SweepSpec.from_dict(data).arms_on_node()
    assert plan.paths["default"].kernel == "custom_all_reduce", plan.paths["default"]
    # the deprecated spelling (a spec refuses it; an engine config may carry it) resolves to attn_dp_size = dp_size
    assert attention_dp_of({"enable_dp_attention": True, "dp_size": 8})
    assert not attention_dp_of({"enable_dp_attention": True}) and not attention_dp_of({"attn_dp_size": 1})


def test_the_deepseek_v41_exception_to_fusion_is_stated_where_it_could_apply() -> None:
    def reason(tp: int) -> str:
        return predict(gpu_kind=GpuKind.parse("sm100-nvlink"), architecture="DeepseekV4ForCausalLM", tp_size=tp,
                       disable_custom_all_reduce=False, enforce_disable_fusion=False).reason

    assert "prefer_custom_dsv41" in reason(4) and "overrides.py:978-990" in reason(4)
    assert "prefer_custom_dsv41" not in reason(8)
