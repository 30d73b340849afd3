"""Which kernel carries decode's all-reduce: SGLang 0.5.23's rule (serving.all_reduce_rules), what the
running engine shows (serving.engine.all_reduce_observed), the node read with nvidia-smi
(serving.engine.gpu_topology), and the arms a spec measures on a node (orchestrator.space.arms)."""

from __future__ import annotations

import optuna
import pytest

from orchestrator.space.define_by_run import DefineByRunSpace
from orchestrator.spec import SweepSpec
from orchestrator.sweep.execution.sweep_preflight import PreflightError, node_gpu_kind
from serving.all_reduce_rules import GpuKind, predict
from serving.engine.all_reduce_observed import observe_all_reduce
from serving.engine.command import build_command
from serving.engine.gpu_topology import gpu_kind_name, parse_query, parse_topology

KIMI = "KimiK25ForConditionalGeneration"


def _path(kind: str, arch: str | None = KIMI, tp: int = 8, *, disable: bool = False, no_fusion: bool = False,
          nnodes: int = 1):
    return predict(gpu_kind=GpuKind.parse(kind), architecture=arch, tp_size=tp, disable_custom_all_reduce=disable,
                   enforce_disable_fusion=no_fusion, nnodes=nnodes)


# --- the rule -----------------------------------------------------------------------------------------


def test_kimi_on_an_h200_nvlink_node_gets_fusion_by_default_and_custom_or_nccl_without_it() -> None:
    default = _path("sm90-nvlink")
    assert default.kernel == "flashinfer_fusion" and default.fusion_backend == "auto"
    assert default.fusion_line == f"Auto-enabling FlashInfer AllReduce Fusion (auto) for {KIMI}"
    assert _path("sm90-nvlink", no_fusion=True).kernel == "custom_all_reduce"
    nccl = _path("sm90-nvlink", disable=True, no_fusion=True)
    assert nccl.kernel == "nccl" and nccl.nccl_carries_decode
    assert _path("sm100-nvlink").kernel == "flashinfer_fusion"


def test_on_eight_pcie_gpus_every_arm_is_nccl_and_every_rank_says_why() -> None:
    for disable, no_fusion in ((False, False), (False, True), (True, True)):
        assert _path("sm120-pcie", disable=disable, no_fusion=no_fusion).kernel == "nccl"
    line = _path("sm120-pcie").custom_off_line
    assert line == ("CustomAllreduce is disabled because it's not supported on more than two PCIe-only GPUs. To "
                    "silence this warning, specify disable_custom_all_reduce=True explicitly.")
    assert _path("sm90-pcie").kernel == "flashinfer_fusion", "fusion is decided by the sm, not the link"


@pytest.mark.parametrize(("kind", "arch", "tp", "nnodes", "kernel"), [
    ("sm120-pcie", KIMI, 2, 1, "custom_all_reduce"),  # two PCIe GPUs: custom all-reduce engages
    ("sm90-nvlink", "LlamaForCausalLM", 8, 1, "custom_all_reduce"),  # not a fusion architecture
    ("sm90-nvlink", KIMI, 3, 1, "flashinfer_fusion"),  # fusion does not care about the world size
    ("sm90-nvlink", "LlamaForCausalLM", 3, 1, "custom_all_reduce"),  # CustomAllReduceV2: sm90 world sizes 2-8
    ("sm120-pcie", "LlamaForCausalLM", 3, 1, "nccl"),  # V2 needs NVLink; the legacy class: 2, 4, 6, 8
    ("sm100-nvlink", "LlamaForCausalLM", 16, 1, "custom_all_reduce"),  # V2 on sm100: 2-8 and 16
    ("sm90-nvlink", "LlamaForCausalLM", 16, 1, "nccl"),  # V2 on sm90: 2-8; the legacy class: 2, 4, 6, 8
    ("sm90-nvlink", KIMI, 16, 2, "nccl"),  # two sm90 nodes: no fusion, custom all-reduce off across nodes
    ("sm100-nvlink", KIMI, 16, 2, "flashinfer_fusion"),  # sm100 fuses across nodes (MNNVL)
    ("sm80-nvlink", KIMI, 8, 1, "custom_all_reduce"),  # A100: no fusion
    ("cpu", KIMI, 2, 1, "nccl"),  # the reference engine on a CPU: gloo stands in for NCCL
    ("sm90-nvlink", KIMI, 1, 1, "none"),
])
def test_the_rule_across_nodes(kind: str, arch: str, tp: int, nnodes: int, kernel: str) -> None:
    assert _path(kind, arch, tp, nnodes=nnodes).kernel == kernel


def test_an_unknown_architecture_is_said_where_fusion_could_apply() -> None:
    assert "architecture unknown" in predict(gpu_kind=GpuKind.parse("sm90-pcie"), architecture=None, tp_size=8,
                                              disable_custom_all_reduce=False, enforce_disable_fusion=False).reason


@pytest.mark.parametrize("bad", ["h200", "sm90", "sm90-nvswitch", ""])
def test_a_gpu_kind_that_is_no_kind_is_refused_naming_the_kinds(bad: str) -> None:
    with pytest.raises(ValueError, match="sm90-nvlink"):
        GpuKind.parse(bad)


# --- reading the engine --------------------------------------------------------------------------------


def _log(*lines: str) -> str:
    return "\n".join(f"[2026-12-03 10:00:00 {line}" for line in lines)


OFF = "CustomAllreduce is disabled because it's not supported on more than two PCIe-only GPUs. To silence ..."


def test_fusion_is_read_from_server_info() -> None:
    seen = observe_all_reduce(server_info={"flashinfer_allreduce_fusion_backend": "auto", "tp_size": 8},
                              log_text="", tp_size=8)
    assert seen.kernel == "flashinfer_fusion" and "flashinfer_allreduce_fusion_backend=auto" in seen.evidence


def test_custom_all_reduce_off_on_every_rank_is_nccl_on_some_ranks_is_mixed() -> None:
    info = {"flashinfer_allreduce_fusion_backend": None, "disable_custom_all_reduce": False}
    every = _log(*(f"TP{r}] {OFF}" for r in range(4)))
    assert observe_all_reduce(server_info=info, log_text=every, tp_size=4).kernel == "nccl"
    some = _log("TP0] " + OFF, "TP1] " + OFF, "TP2] ready", "TP3] ready")
    seen = observe_all_reduce(server_info=info, log_text=some, tp_size=4)
    assert seen.kernel == "mixed" and seen.ranks_custom_off == [0, 1] and seen.ranks_in_log == [0, 1, 2, 3]


def test_only_the_legacy_kernels_off_line_counts_the_v2_kernel_falls_back_to_it() -> None:
    info = {"flashinfer_allreduce_fusion_backend": None, "disable_custom_all_reduce": False, "device": "cuda"}
    v2_only = _log(*(f"TP{r}] CustomAllReduceV2 is disabled because ..." for r in range(2)))
    assert observe_all_reduce(server_info=info, log_text=v2_only, tp_size=2).kernel == "custom_all_reduce"
    failed = _log(*(f"TP{r} EP{r}] Setup Custom allreduce failed with boom. To silence ..." for r in range(2)))
    assert observe_all_reduce(server_info=info, log_text=failed, tp_size=2).kernel == "nccl"


def test_the_flag_the_device_and_nothing_to_read() -> None:
    assert observe_all_reduce(server_info={"disable_custom_all_reduce": True}, log_text="", tp_size=2).kernel == "nccl"
    assert observe_all_reduce(server_info={"device": "cpu"}, log_text="", tp_size=2).kernel == "nccl"
    emulating = {"device": "cpu", "reference_gpu_kind": "sm90-nvlink", "disable_custom_all_reduce": False}
    assert observe_all_reduce(server_info=emulating, log_text="", tp_size=2).kernel == "custom_all_reduce"
    assert observe_all_reduce(server_info=None, log_text="", tp_size=2).kernel == "unknown"
    assert observe_all_reduce(server_info=None, log_text="", tp_size=1).kernel == "none"
    nested = {"internal_states": [{"flashinfer_allreduce_fusion_backend": "trtllm"}]}  # an older SGLang's shape
    assert observe_all_reduce(server_info=nested, log_text="", tp_size=2).kernel == "flashinfer_fusion"


# --- the node -------------------------------------------------------------------------------------------

H200_TOPO = """\
\tGPU0\tGPU1\tGPU2\tCPU Affinity\tNUMA Affinity
GPU0\t X \tNV18\tNV18\t0-47\t0
GPU1\tNV18\t X \tNV18\t0-47\t0
GPU2\tNV18\tNV18\t X \t0-47\t0

Legend:
  X    = Self
  NV#  = Connection traversing a bonded set of # NVLinks
"""
PCIE_TOPO = """\
\tGPU0\tGPU1\tGPU2\tCPU Affinity
GPU0\t X \tPIX\tSYS\t0-31
GPU1\tPIX\t X \tSYS\t0-31
GPU2\tSYS\tSYS\t X \t32-63
"""


def test_nvidia_smi_output_names_the_node() -> None:
    gpus = parse_query("0, NVIDIA H200, 9.0\n1, NVIDIA H200, 9.0\n2, NVIDIA H200, 9.0\n")
    assert gpus[0] == (0, "NVIDIA H200", "9.0") and len(gpus) == 3
    assert parse_topology(H200_TOPO, count=3) is True
    assert parse_topology(PCIE_TOPO, count=3) is False
    assert parse_topology(H200_TOPO, count=1) is False, "one GPU has no pair"
    assert gpu_kind_name("9.0", full_nvlink=True) == "sm90-nvlink"
    assert gpu_kind_name("12.0", full_nvlink=False) == "sm120-pcie"


# --- a spec's arms on a node -------------------------------------------------------------------------


def _spec(gpu_kind: str, *, arms=("default", "no_fusion", "nccl"), tp: int = 8, kind: str = "sglang",
          nccl_env: dict | None = None, nnodes: int = 1) -> SweepSpec:
    engine = {"kind": kind, "model_path": "moonshotai/Kimi-K2.5" if kind == "sglang" else "ref-tiny",
              "draft_model_path": "lightseekorg/kimi-k2.5-eagle3-mla" if kind == "sglang" else "ref-tiny-draft",
              "tp_size": tp, "gpu_kind": gpu_kind, "architecture": KIMI, "nnodes": nnodes}
    return SweepSpec.from_dict({
        "name": "arms", "engine": engine,
        "search": {"speculative": {"num_steps": [2, 3], "eagle_topk": [1]}, "all_reduce": list(arms),
                   "nccl_env": nccl_env if nccl_env is not None else {"NCCL_ALGO": [None, "Ring", "Tree"]}},
        "benchmark": {"concurrency": [1]},
    })


def test_on_a_pcie_node_with_tp8_the_arms_are_one_kernel_and_measured_once() -> None:
    spec = _spec("sm120-pcie")
    plan = spec.arms_on_node()
    assert plan.measured == ("default",) and plan.stands_for == {"default": "default", "no_fusion": "default",
                                                                  "nccl": "default"}
    space = spec.space()
    assert space.all_reduce == ("default",) and len(space) == 2 * 3  # 2 chains x 3 NCCL_ALGO, one arm
    assert {c.all_reduce for c in space} == {"default"}
    assert any("measured once" in w for w in spec.warnings())


def test_on_an_nvlink_node_ncc_variables_are_searched_only_on_the_nccl_arm() -> None:
    spec = _spec("sm90-nvlink")
    space = spec.space()
    assert space.all_reduce == ("default", "no_fusion", "nccl") and space.nccl_arms == ("nccl",)
    points = list(space)
    assert len(points) == len(space) == 2 * (1 + 1 + 3)
    assert all(not c.nccl_env for c in points if c.all_reduce != "nccl")
    assert {c.nccl_env.get("NCCL_ALGO") for c in points if c.all_reduce == "nccl"} == {None, "Ring", "Tree"}
    # Optuna samples the same conditional space: never an NCCL variable on the fusion or custom arm
    sampler_space = DefineByRunSpace(spec)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    for _ in range(60):
        plan = sampler_space.sample(study.ask())
        assert plan.candidate in space
        if plan.candidate.all_reduce != "nccl":
            assert plan.candidate.nccl_env == {}
    for plan in sampler_space.candidates():  # one-factor variants stay in the space too
        assert all(v.candidate in space for v in sampler_space.variants(plan))


def test_the_nccl_arm_gets_both_flags_and_only_the_reference_engine_gets_a_declared_kind() -> None:
    spec = _spec("sm90-nvlink")
    argv = build_command(spec.engine_config(num_steps=None, eagle_topk=None, num_draft_tokens=None, all_reduce="nccl"),
                         port=1).argv
    assert "--disable-custom-all-reduce" in argv and "--enforce-disable-flashinfer-allreduce-fusion" in argv
    assert "--reference-gpu-kind" not in argv and "--json-model-override-args" not in argv
    no_fusion = build_command(spec.engine_config(num_steps=None, eagle_topk=None, num_draft_tokens=None,
                                                 all_reduce="no_fusion"), port=1).argv
    assert "--enforce-disable-flashinfer-allreduce-fusion" in no_fusion and "--disable-custom-all-reduce" not in no_fusion
    reference = _spec("sm90-nvlink", kind="reference", tp=2)
    argv = build_command(reference.engine_config(num_steps=None, eagle_topk=None, num_draft_tokens=None), port=1).argv
    assert argv[argv.index("--reference-gpu-kind") + 1] == "sm90-nvlink"
    assert KIMI in argv[argv.index("--json-model-override-args") + 1]


def test_nccl_settings_on_a_node_where_no_arm_uses_nccl_are_refused() -> None:
    with pytest.raises(ValueError, match="NCCL carries decode's all-reduce on none of the arms"):
        _spec("sm90-nvlink", arms=("default", "no_fusion"))
    _spec("sm120-pcie", arms=("default",))  # every arm is NCCL there: fine


def test_across_nodes_nccl_carries_decode_on_every_arm_so_the_variables_are_searched() -> None:
    spec = _spec("sm90-nvlink", arms=("default", "no_fusion"), tp=16, nnodes=2)  # refused on one node (above)
    plan = spec.arms_on_node()
    assert {plan.paths[arm].kernel for arm in spec.search.all_reduce} == {"nccl"}, plan.lines()
    assert plan.measured == ("default",) and plan.nccl_arms == ("default",)
    assert "spans across nodes" in plan.paths["default"].custom_off_line


def test_gpu_kind_cpu_is_for_the_reference_engine_only() -> None:
    with pytest.raises(ValueError, match="gpu_kind: cpu is only for the reference engine"):
        _spec("cpu")


def test_a_legacy_custom_arm_is_read_as_default() -> None:
    assert _spec("auto", arms=("custom", "nccl")).search.all_reduce == ["default", "nccl"]


def test_the_preflight_refuses_a_spec_written_for_another_node_and_resolves_auto() -> None:
    found = {"kind": "sm120-pcie", "detail": "8x NVIDIA RTX PRO 6000, compute capability 12.0, not NVLink"}
    with pytest.raises(PreflightError, match="written for sm90-nvlink, but node n1 is sm120-pcie"):
        node_gpu_kind(_spec("sm90-nvlink"), found, node="n1")
    kind, note = node_gpu_kind(_spec("auto"), found, node="n1")
    assert kind == "sm120-pcie" and "n1 is sm120-pcie" in note
    assert _spec("auto").on_node(gpu_kind=kind).space().all_reduce == ("default",)
    assert node_gpu_kind(_spec("auto", kind="reference", tp=2), None, node="n1")[0] == "cpu"
    assert node_gpu_kind(_spec("auto"), None, node="n1")[0] is None  # no nvidia-smi: nothing collapsed


def test_the_preflight_reads_a_local_models_architecture_from_its_config(tmp_path) -> None:
    from orchestrator.sweep.execution.sweep_preflight import _local_architecture

    (tmp_path / "config.json").write_text('{"architectures": ["KimiK25ForConditionalGeneration"]}')
    assert _local_architecture(str(tmp_path)) == KIMI
    assert _local_architecture(str(tmp_path / "missing")) is None
    assert _local_architecture("moonshotai/Kimi-K2.5") is None  # a hub id: not read
    planned = _spec("auto").on_node(gpu_kind="sm90-nvlink", architecture="LlamaForCausalLM")
    assert planned.engine.architecture == "LlamaForCausalLM" and planned.arms_on_node().paths["default"].kernel == (
        "custom_all_reduce")
