"""The opt-in paths as arms of the search (issue 44): which arm runs which kernel on which declared
node (``orchestrator.space.arms``), which are measured once, which SGLang refuses there; the spec's
rules for them (NVLink multicast named in ``allow_dangerous``, no flag set twice); and reading the
kernel back from an engine's ``/server_info`` and per-rank log lines (``all_reduce_observed``)."""

from __future__ import annotations

import pytest

from orchestrator.space import ALL_REDUCE_ARMS, ARM_FLAGS, ARM_MULTICAST, arm_extra_args, arm_flags
from orchestrator.spec import SpecError, SweepSpec
from serving.all_reduce_rules import GpuKind, opt_in_rank_lines
from serving.engine.all_reduce_observed import observe_all_reduce
from serving.engine.command import build_command

KIMI = "KimiK25ForConditionalGeneration"
EVERY_ARM = list(ALL_REDUCE_ARMS)


def _spec(kind: str, arms: list[str], *, tp: int = 8, nnodes: int = 1, architecture: str = KIMI,
          allow: list[str] | None = None, extra_args: dict | None = None, mscclpp: bool = False) -> SweepSpec:
    return SweepSpec.from_dict({
        "name": "arms", "engine": {"kind": "sglang", "model_path": "org/model", "draft_model_path": "org/draft",
                                   "tp_size": tp, "nnodes": nnodes, "gpu_kind": kind, "architecture": architecture,
                                   "mscclpp_installed": mscclpp, "extra_args": extra_args or {}},
        "search": {"all_reduce": arms, "allow_dangerous": list(ARM_MULTICAST) if allow is None else allow},
        "benchmark": {"concurrency": [1]},
    })


def test_each_arm_is_its_flags_and_only_the_switch_arms_leave_extra_args_alone() -> None:
    assert arm_flags("nccl_symm_mem") == {"disable_custom_all_reduce": True,
                                          "enforce_disable_flashinfer_allreduce_fusion": True}
    assert arm_extra_args("nccl_symm_mem") == {"enable_symm_mem": True}
    assert arm_extra_args("mscclpp") == {"enable_mscclpp": True}
    assert arm_flags("mscclpp")["disable_custom_all_reduce"] is False  # MSCCL++ ranks ahead of custom all-reduce
    assert arm_extra_args("fusion_mnnvl") == {"flashinfer_allreduce_fusion_backend": "mnnvl"}
    assert all(arm_extra_args(arm) == {} for arm in ("default", "no_fusion", "nccl"))
    assert set(ARM_MULTICAST) < set(ARM_FLAGS) == set(ALL_REDUCE_ARMS)


def test_on_an_h200_node_a_kimi_spec_measures_every_arm_that_runs_its_own_kernel() -> None:
    plan = _spec("sm90-nvlink", EVERY_ARM).arms_on_node()
    # default is SGLang's own fusion (auto -> trtllm on sm90); cutedsl is Blackwell-only; mscclpp is not installed
    assert plan.measured == ("default", "no_fusion", "nccl", "fusion_mnnvl", "torch_symm_mem", "nccl_symm_mem")
    assert plan.stands_for["fusion_trtllm"] == "default" and plan.stands_for["mscclpp"] == "no_fusion"
    assert set(plan.refused) == {"fusion_cutedsl"} and "Blackwell" in plan.refused["fusion_cutedsl"]
    assert plan.nccl_arms == ("nccl", "nccl_symm_mem")  # NCCL's variables reach NCCL on symmetric memory too
    assert plan.paths["default"].fusion_backend == "trtllm" and plan.paths["fusion_mnnvl"].fusion_backend == "mnnvl"
    assert any("refuses to start" in line for line in plan.lines())


def test_on_a_b200_node_auto_fusion_is_mnnvl_so_trtllm_and_cutedsl_are_the_arms_that_differ() -> None:
    plan = _spec("sm100-nvlink", EVERY_ARM, mscclpp=True).arms_on_node()
    assert plan.stands_for["fusion_mnnvl"] == "default" and not plan.refused
    assert {"fusion_trtllm", "fusion_cutedsl", "mscclpp", "torch_symm_mem"} <= set(plan.measured)


def test_on_eight_pcie_gpus_only_nccl_its_symmetric_memory_and_pcie_ipc_remain() -> None:
    plan = _spec("sm120-pcie", EVERY_ARM, mscclpp=True).arms_on_node()
    assert plan.measured == ("default", "nccl_symm_mem", "pcie_ipc") and plan.nccl_arms == ("default", "nccl_symm_mem")
    assert {arm for arm, to in plan.stands_for.items() if to == "default"} == {
        "default", "no_fusion", "nccl", "mscclpp", "torch_symm_mem"}
    assert set(plan.refused) == {"fusion_trtllm", "fusion_mnnvl", "fusion_cutedsl"}


def test_across_two_nodes_torch_symmetric_memory_and_fusion_fall_away_and_mscclpp_needs_its_package() -> None:
    plan = _spec("sm90-nvlink", ["default", "torch_symm_mem", "mscclpp", "fusion_trtllm"], tp=16, nnodes=2,
                 mscclpp=True).arms_on_node()
    assert plan.measured == ("default", "mscclpp") and plan.stands_for["torch_symm_mem"] == "default"
    assert "single-node only" in plan.refused["fusion_trtllm"]


def test_a_multicast_arm_must_be_named_in_allow_dangerous_and_a_flag_is_set_once() -> None:
    with pytest.raises(SpecError) as refused:
        _spec("sm90-nvlink", ["default", "torch_symm_mem", "nccl_symm_mem"], allow=["nccl_symm_mem"])
    (problem,) = [str(p) for p in refused.value.problems]
    assert problem.startswith("search.all_reduce: the arm 'torch_symm_mem' turns on NVLink multicast")
    assert "add 'torch_symm_mem' to search.allow_dangerous" in problem
    _spec("sm90-nvlink", ["default", "fusion_trtllm"], allow=[])  # trtllm's IPC buffers need no multicast
    with pytest.raises(SpecError, match=r"engine.extra_args.enable_symm_mem: the search.all_reduce arm "
                                        r"'nccl_symm_mem' sets it"):
        _spec("sm90-nvlink", ["default", "nccl_symm_mem"], allow=["nccl_symm_mem", "enable_symm_mem"],
              extra_args={"enable_symm_mem": True})


def test_mscclpp_is_planned_as_custom_all_reduce_where_decode_runs_without_cuda_graphs() -> None:
    for eager in ({"disable_decode_cuda_graph": True}, {"cuda_graph_backend_decode": "disabled"}):
        plan = _spec("sm90-nvlink", ["default", "mscclpp"], mscclpp=True, architecture="LlamaForCausalLM",
                     extra_args=eager).arms_on_node()
        assert plan.stands_for["mscclpp"] == "default", eager
    assert _spec("sm90-nvlink", ["default", "mscclpp"], mscclpp=True,
                 architecture="LlamaForCausalLM").arms_on_node().measured == ("default", "mscclpp")


def test_a_fixed_fusion_backend_is_dropped_on_the_arms_that_force_fusion_off() -> None:
    plan = _spec("sm120-pcie", ["default", "no_fusion", "nccl"],
                 extra_args={"flashinfer_allreduce_fusion_backend": "trtllm"}).arms_on_node()
    assert set(plan.refused) == {"default"} and plan.measured == ("no_fusion",)  # overrides.py drops it there


def test_a_spec_whose_every_arm_sglang_refuses_on_its_node_is_refused() -> None:
    with pytest.raises(SpecError, match="SGLang refuses to start with every arm"):
        _spec("sm120-pcie", ["fusion_trtllm", "fusion_mnnvl"])


def test_the_engine_command_of_an_opt_in_arm_carries_its_flags() -> None:
    spec = _spec("sm90-nvlink", ["default", "torch_symm_mem", "fusion_mnnvl"])
    argv = build_command(spec.engine_config(num_steps=None, eagle_topk=None, num_draft_tokens=None,
                                            all_reduce="torch_symm_mem"), port=1).argv
    assert {"--enable-torch-symm-mem", "--disable-custom-all-reduce",
            "--enforce-disable-flashinfer-allreduce-fusion"} <= set(argv)
    argv = build_command(spec.engine_config(num_steps=None, eagle_topk=None, num_draft_tokens=None,
                                            all_reduce="fusion_mnnvl"), port=1).argv
    assert argv[argv.index("--flashinfer-allreduce-fusion-backend") + 1] == "mnnvl"


# --- reading the kernel back -------------------------------------------------------------------------------


def _log(lines_by_rank: dict[int, list[str]]) -> str:
    return "\n".join(f"[2026-12-06 01:00:00 TP{rank}] WARNING x: {line}"
                     for rank, lines in lines_by_rank.items() for line in lines)


def _lines(kind: str, ws: int, **flags) -> list[str]:
    return [text for _, text in opt_in_rank_lines(gpu_kind=GpuKind.parse(kind), world_size=ws, **flags)]


def test_mscclpp_is_read_from_every_ranks_created_line_and_not_inside_eager_decode() -> None:
    up = _lines("sm90-nvlink", 4, enable_mscclpp=True, mscclpp_installed=True)
    info = {"enable_mscclpp": True, "disable_custom_all_reduce": False, "device": "cuda"}
    assert observe_all_reduce(server_info=info, log_text=_log({r: up for r in range(4)}), tp_size=4).kernel == "mscclpp"
    assert observe_all_reduce(server_info=info, log_text=_log({0: up, 1: up}), tp_size=4).kernel == "unknown"
    half = _log({0: up, 1: up, 2: ["ready"], 3: ["ready"]})
    assert observe_all_reduce(server_info=info, log_text=half, tp_size=4).kernel == "mixed"
    assert observe_all_reduce(server_info=info, log_text="", tp_size=4).kernel == "unknown"
    every_up = _log({r: up for r in range(4)})
    for eager in ({"cuda_graph_backend_decode": "disabled"}, {"disable_decode_cuda_graph": True},  # graphs only
                  {"cuda_graph_config": {"decode": {"backend": "disabled"}}}):  # SGLang's resolved field wins
        assert observe_all_reduce(server_info={**info, **eager}, log_text=every_up,
                                  tp_size=4).kernel == "custom_all_reduce", eager
    resolved_on = {**info, "disable_cuda_graph": True, "cuda_graph_config": {"decode": {"backend": "full"}}}
    assert observe_all_reduce(server_info=resolved_on, log_text=every_up, tp_size=4).kernel == "mscclpp"
    missing = _lines("sm90-nvlink", 4, enable_mscclpp=True)
    assert missing == ["PyMscclpp is unavailable because its dependencies failed to import: No module named 'mscclpp'"]
    assert observe_all_reduce(server_info=info, log_text=_log({r: missing for r in range(4)}),
                              tp_size=4).kernel == "custom_all_reduce"


def test_symmetric_memory_is_read_from_the_server_args_and_torchs_unavailable_lines() -> None:
    off = {"disable_custom_all_reduce": True, "device": "cuda"}
    assert observe_all_reduce(server_info={**off, "enable_symm_mem": True}, log_text="",
                              tp_size=2).kernel == "nccl_symm_mem"
    torch_on = {**off, "enable_torch_symm_mem": True}
    quiet = _log({0: ["ready"], 1: ["ready"]})
    assert observe_all_reduce(server_info=torch_on, log_text=quiet, tp_size=2).kernel == "torch_symm_mem"
    assert observe_all_reduce(server_info=torch_on, log_text="", tp_size=2).kernel == "unknown"  # no rank seen
    pcie = _lines("sm90-pcie", 2, enable_torch_symm_mem=True)
    assert pcie == ["TorchSymmMemCommunicator: torch symmetric memory multicast operations are not supported."]
    assert observe_all_reduce(server_info=torch_on, log_text=_log({0: pcie, 1: pcie}), tp_size=2).kernel == "nccl"
    assert observe_all_reduce(server_info={**torch_on, "reference_gpu_kind": "cpu"}, log_text=quiet,
                              tp_size=2).kernel == "nccl"
    assert _lines("sm120-pcie", 2, enable_torch_symm_mem=True) == [
        "TorchSymmMemCommunicator: Device capability 12 not supported, communicator is not available."]
