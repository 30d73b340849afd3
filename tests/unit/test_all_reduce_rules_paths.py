"""The opt-in all-reduce paths of SGLang 0.5.23 (serving.all_reduce_rules.engages / decode_kernel /
PATH_RULES): where each engages on a declared node kind, where it does not, across nodes, where it
ranks against fusion / custom all-reduce / NCCL, and that ``predict`` is unchanged without them."""

from __future__ import annotations

import pytest

from serving.all_reduce_rules import (
    KERNEL_WORDS,
    PATH_RULES,
    GpuKind,
    decode_kernel,
    engages,
    predict,
    resolve_fusion_backend,
)
from serving.sglang_flags import sglang_flags

KIMI = "KimiK25ForConditionalGeneration"
LLAMA = "LlamaForCausalLM"


def _engages(path: str, kind: str, ws: int, **kwargs) -> bool:
    ok, why = engages(path, gpu_kind=GpuKind.parse(kind), world_size=ws, **kwargs)
    assert why and why.strip() == why
    return ok


# --- the table ----------------------------------------------------------------------------------------


def test_every_opt_in_flag_has_a_rule_and_nccl_nvls_has_none() -> None:
    assert {rule.flag for rule in PATH_RULES.values()} == {
        "--enable-torch-symm-mem", "--enable-mscclpp", "--enable-symm-mem",
        "--flashinfer-allreduce-fusion-backend", "--enable-fused-moe-sum-all-reduce",
        "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1"}  # PCIe-IPC has no flag, only SGLang's variable
    assert all("nvls" not in rule.flag for rule in PATH_RULES.values())
    for rule in PATH_RULES.values():
        assert rule.source and rule.precedence and rule.declared_kind_cannot_tell
        assert rule.kernel is None or rule.kernel in KERNEL_WORDS
    with pytest.raises(ValueError, match="not an all-reduce path"):
        engages("nccl_nvls", gpu_kind=GpuKind.parse("sm90-nvlink"), world_size=8)


def test_the_five_flags_are_sglang_flags_with_the_expected_types() -> None:
    flags = sglang_flags().flags
    for name, dest in (("--enable-torch-symm-mem", "enable_torch_symm_mem"), ("--enable-mscclpp", "enable_mscclpp"),
                       ("--enable-symm-mem", "enable_symm_mem"),
                       ("--enable-fused-moe-sum-all-reduce", "enable_fused_moe_sum_all_reduce")):
        flag = flags[name]
        assert flag.dest == dest and not flag.takes_value and flag.nargs == 0 and not flag.deprecated
    backend = flags["--flashinfer-allreduce-fusion-backend"]
    assert backend.dest == "flashinfer_allreduce_fusion_backend" and backend.takes_value and backend.nargs is None
    assert not backend.deprecated
    for choice in ("'auto'", "'trtllm'", "'mnnvl'", "'cutedsl'"):  # the list records help, not choices
        assert choice in backend.help


# --- torch symmetric memory -----------------------------------------------------------------------------


def test_torch_symm_mem_on_sm90_and_sm100_nvlink_at_world_sizes_2_4_6_8_only() -> None:
    for kind in ("sm90-nvlink", "sm100-nvlink"):
        for ws in (2, 4, 6, 8):
            assert _engages("torch_symm_mem", kind, ws, disable_custom_all_reduce=True), (kind, ws)
        for ws in (3, 5, 16):
            assert not _engages("torch_symm_mem", kind, ws, disable_custom_all_reduce=True), (kind, ws)
    for kind in ("sm120-pcie", "sm80-nvlink", "sm90-pcie", "cpu"):
        assert not _engages("torch_symm_mem", kind, 8, disable_custom_all_reduce=True), kind
    assert not _engages("torch_symm_mem", "sm90-nvlink", 8, disable_custom_all_reduce=True,
                        activation_dtype="float16")


def test_torch_symm_mem_ranks_behind_custom_all_reduce_and_fusion() -> None:
    ok, why = engages("torch_symm_mem", gpu_kind=GpuKind.parse("sm90-nvlink"), world_size=8, architecture=LLAMA)
    assert not ok and "custom all-reduce ranks ahead" in why
    assert not _engages("torch_symm_mem", "sm90-nvlink", 8, architecture=KIMI, disable_custom_all_reduce=True)
    assert _engages("torch_symm_mem", "sm90-nvlink", 8, architecture=KIMI, disable_custom_all_reduce=True,
                    enforce_disable_fusion=True)
    # world size 3: custom all-reduce is off by itself, but torch symm mem has no table entry either
    assert not _engages("torch_symm_mem", "sm90-nvlink", 3, architecture=LLAMA)


def test_torch_symm_mem_across_nodes_is_not_assumed() -> None:
    ok, why = engages("torch_symm_mem", gpu_kind=GpuKind.parse("sm100-nvlink"), world_size=8, nnodes=2,
                      disable_custom_all_reduce=True)
    assert not ok and "MNNVL" in why


# --- MSCCL++ ---------------------------------------------------------------------------------------------


def test_mscclpp_needs_the_package_and_then_ranks_ahead_of_custom_all_reduce() -> None:
    ok, why = engages("mscclpp", gpu_kind=GpuKind.parse("sm90-nvlink"), world_size=8, architecture=LLAMA)
    assert not ok and "not require" in why, "not installed with SGLang: the conservative answer is no"
    ok, why = engages("mscclpp", gpu_kind=GpuKind.parse("sm90-nvlink"), world_size=8, architecture=LLAMA,
                      mscclpp_installed=True)
    assert ok and "ahead of custom all-reduce" in why
    assert not _engages("mscclpp", "sm90-nvlink", 8, architecture=KIMI, mscclpp_installed=True), "fusion first"
    assert not _engages("mscclpp", "sm90-nvlink", 8, architecture=LLAMA, mscclpp_installed=True, cuda_graph=False)
    for ws in (2, 6):
        assert not _engages("mscclpp", "sm90-nvlink", ws, architecture=LLAMA, mscclpp_installed=True), ws
    assert not _engages("mscclpp", "sm120-pcie", 8, mscclpp_installed=True)


def test_mscclpp_across_two_nodes() -> None:
    assert _engages("mscclpp", "sm90-nvlink", 16, nnodes=2, architecture=LLAMA, mscclpp_installed=True)
    assert not _engages("mscclpp", "sm90-nvlink", 24, nnodes=3, architecture=LLAMA, mscclpp_installed=True)


# --- NCCL symmetric memory -------------------------------------------------------------------------------


def test_nccl_symm_mem_carries_decode_where_custom_all_reduce_does_not() -> None:
    assert _engages("nccl_symm_mem", "sm120-pcie", 8)  # custom all-reduce off on 8 PCIe GPUs
    assert not _engages("nccl_symm_mem", "sm120-pcie", 2)  # custom all-reduce engages on two PCIe GPUs
    assert not _engages("nccl_symm_mem", "sm90-nvlink", 8, architecture=LLAMA)
    assert _engages("nccl_symm_mem", "sm90-nvlink", 8, architecture=LLAMA, disable_custom_all_reduce=True)
    assert _engages("nccl_symm_mem", "sm90-nvlink", 16, nnodes=2, architecture=KIMI)  # no fusion, no custom
    assert not _engages("nccl_symm_mem", "cpu", 2)
    kernel, _ = decode_kernel(gpu_kind=GpuKind.parse("sm90-nvlink"), architecture=LLAMA, tp_size=8,
                              disable_custom_all_reduce=True, enable_symm_mem=True, enable_torch_symm_mem=True)
    assert kernel == "nccl_symm_mem", "NCCL symmetric memory is asked before torch symmetric memory"


# --- FlashInfer fusion backend ---------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "backend", "nnodes", "resolved"), [
    ("sm90-nvlink", "auto", 1, "trtllm"),
    ("sm90-pcie", "auto", 1, "trtllm"),
    ("sm100-nvlink", "auto", 1, "mnnvl"),
    ("sm100-nvlink", "auto", 2, "mnnvl"),
    ("sm90-nvlink", "auto", 2, None),
    ("sm90-nvlink", "trtllm", 1, "trtllm"),
    ("sm100-nvlink", "trtllm", 2, None),
    ("sm90-nvlink", "mnnvl", 1, "mnnvl"),
    ("sm90-nvlink", "mnnvl", 2, None),
    ("sm100-nvlink", "mnnvl", 2, "mnnvl"),
    ("sm90-nvlink", "cutedsl", 1, None),
    ("sm120-pcie", "auto", 1, None),
    ("sm80-nvlink", "trtllm", 1, None),
])
def test_fusion_backend_resolution(kind: str, backend: str, nnodes: int, resolved: str | None) -> None:
    got, why = resolve_fusion_backend(backend, gpu_kind=GpuKind.parse(kind), nnodes=nnodes)
    assert got == resolved, why
    assert _engages("flashinfer_fusion_backend", kind, 8 * nnodes, nnodes=nnodes, fusion_backend=backend) == (
        resolved is not None)


def test_fusion_backend_given_beats_custom_all_reduce_for_any_model_and_enforce_disable_wins() -> None:
    assert _engages("flashinfer_fusion_backend", "sm90-nvlink", 8, architecture=LLAMA)
    assert not _engages("flashinfer_fusion_backend", "sm90-nvlink", 8, enforce_disable_fusion=True)
    assert not _engages("flashinfer_fusion_backend", "sm90-nvlink", 1)
    with pytest.raises(ValueError, match="refuses"):
        decode_kernel(gpu_kind=GpuKind.parse("sm120-pcie"), architecture=KIMI, tp_size=8, fusion_backend="auto")


# --- fused MoE sum -----------------------------------------------------------------------------------------


def test_fused_moe_sum_all_reduce_never_changes_the_all_reduce_kernel() -> None:
    for kind in ("sm90-nvlink", "sm120-pcie", "sm100-nvlink"):
        ok, why = engages("fused_moe_sum_all_reduce", gpu_kind=GpuKind.parse(kind), world_size=8)
        assert not ok and "atomic" in why
    with_it = decode_kernel(gpu_kind=GpuKind.parse("sm120-pcie"), architecture=KIMI, tp_size=8,
                            enable_fused_moe_sum_all_reduce=True)
    assert with_it == decode_kernel(gpu_kind=GpuKind.parse("sm120-pcie"), architecture=KIMI, tp_size=8) == (
        "nccl", predict(gpu_kind=GpuKind.parse("sm120-pcie"), architecture=KIMI, tp_size=8,
                        disable_custom_all_reduce=False, enforce_disable_fusion=False).reason)


# --- nothing changes without the new flags -----------------------------------------------------------------

_BEFORE = [  # (kind, arch, tp, nnodes, disable, no_fusion, kernel): tests/unit/test_all_reduce.py's cases
    ("sm90-nvlink", KIMI, 8, 1, False, False, "flashinfer_fusion"),
    ("sm90-nvlink", KIMI, 8, 1, False, True, "custom_all_reduce"),
    ("sm90-nvlink", KIMI, 8, 1, True, True, "nccl"),
    ("sm100-nvlink", KIMI, 8, 1, False, False, "flashinfer_fusion"),
    ("sm120-pcie", KIMI, 8, 1, False, False, "nccl"),
    ("sm120-pcie", KIMI, 2, 1, False, False, "custom_all_reduce"),
    ("sm90-nvlink", LLAMA, 8, 1, False, False, "custom_all_reduce"),
    ("sm90-nvlink", LLAMA, 3, 1, False, False, "custom_all_reduce"),  # CustomAllReduceV2 (sm90: 2-8)
    ("sm90-nvlink", KIMI, 16, 2, False, False, "nccl"),
    ("sm100-nvlink", KIMI, 16, 2, False, False, "flashinfer_fusion"),
    ("sm80-nvlink", KIMI, 8, 1, False, False, "custom_all_reduce"),
    ("cpu", KIMI, 2, 1, False, False, "nccl"),
    ("sm90-nvlink", KIMI, 1, 1, False, False, "none"),
]


@pytest.mark.parametrize(("kind", "arch", "tp", "nnodes", "disable", "no_fusion", "kernel"), _BEFORE)
def test_without_the_new_flags_predict_and_decode_kernel_agree_with_before(
        kind: str, arch: str, tp: int, nnodes: int, disable: bool, no_fusion: bool, kernel: str) -> None:
    path = predict(gpu_kind=GpuKind.parse(kind), architecture=arch, tp_size=tp, disable_custom_all_reduce=disable,
                   enforce_disable_fusion=no_fusion, nnodes=nnodes)
    assert path.kernel == kernel
    got = decode_kernel(gpu_kind=GpuKind.parse(kind), architecture=arch, tp_size=tp,
                        disable_custom_all_reduce=disable, enforce_disable_fusion=no_fusion, nnodes=nnodes)
    assert got == (path.kernel, path.reason)
