"""Which kernel carries decode's tensor-parallel all-reduce: SGLang 0.5.23's rule, written once.

In precedence order (sources under ``sglang/srt/``; ``GroupCoordinator`` is in
``distributed/parallel_state.py``):

* FlashInfer's fused all-reduce + RMSNorm: ``arg_groups/overrides.py``
  ``_flashinfer_allreduce_fusion_auto_enable`` (off by ``_enforce_disable_allreduce_fusion``), or
  ``--flashinfer-allreduce-fusion-backend`` given (checked by ``layers/flashinfer_comm_fusion.py``
  ``_resolve_backend``); it runs at the RMSNorm call site, before ``GroupCoordinator.all_reduce``;
* MSCCL++ (``--enable-mscclpp``, opt-in): ``GroupCoordinator.all_reduce`` asks
  ``should_mscclpp_allreduce`` first and ``_resolve_outplace_all_reduce_method`` puts it ahead of
  custom all-reduce; ``distributed/device_communicators/pymscclpp.py`` ``PyMscclppCommunicator``
  (only inside CUDA-graph capture: ``GroupCoordinator.graph_capture`` / ``change_state``);
* SGLang's custom all-reduce: on CUDA the JIT ``CustomAllReduceV2`` by default
  (``SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2``, ``environ.py:1532``; ``custom_all_reduce.py:387-398``
  ``dispatch_custom_allreduce``), which needs full NVLink (``custom_all_reduce_v2.py:582-597``), else
  the legacy ``CustomAllreduce``; both ask ``custom_all_reduce_utils.py``
  ``can_use_custom_all_reduce_with_nvlink`` (``custom_all_reduce_off_lines``);
* NCCL with symmetric memory (``--enable-symm-mem``, opt-in): ``GroupCoordinator.all_reduce``
  sends to pynccl when ``is_symmetric_memory_enabled()`` and neither MSCCL++ nor custom
  all-reduce takes the tensor (``distributed/device_communicators/pynccl_allocator.py``);
* FlashInfer's PCIe-IPC all-reduce (env ``SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1``, opt-in):
  ``_resolve_outplace_all_reduce_method`` right after custom all-reduce
  (``parallel_state.py:963-975``); ``distributed/device_communicators/pcie_ipc_ar.py``;
* PyTorch symmetric memory (``--enable-torch-symm-mem``, opt-in):
  ``_resolve_outplace_all_reduce_method`` after custom all-reduce and MSCCL++;
  ``distributed/device_communicators/torch_symm_mem.py`` ``TorchSymmMemCommunicator``;
* otherwise NCCL.

``--enable-fused-moe-sum-all-reduce`` is no all-reduce path: it fuses the MoE top-k sum into the
down GEMM (``layers/moe/moe_runner/triton_utils/fused_moe.py`` ``_fused_moe_kernel_sequence``).
``--enable-nccl-nvls`` is not modelled.

``predict`` answers from a declared ``GpuKind`` for the three default kernels; ``decode_kernel``
and ``engages`` add the opt-in paths (``PATH_RULES``; PCIe-IPC is switched on by an environment
variable, not a flag). ``serving.engine.all_reduce_observed``
reads what a running engine did.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Optional

__all__ = [
    "AllReducePath",
    "CUSTOM_ALL_REDUCE_V2_WORLD_SIZES",
    "CUSTOM_ALL_REDUCE_WORLD_SIZES",
    "DECLARED_GPU_KINDS",
    "DecodeKernel",
    "FUSION_ARCHITECTURES",
    "FUSION_BACKENDS",
    "GpuKind",
    "Kernel",
    "KERNEL_WORDS",
    "MSCCLPP_WORLD_SIZES",
    "OptInPath",
    "PATH_RULES",
    "PCIE_IPC_BF16_ONLY",
    "PCIE_IPC_BUILT",
    "PCIE_IPC_DETERMINISTIC",
    "PCIE_IPC_ENABLED",
    "PCIE_IPC_ENV",
    "PCIE_IPC_FAILED",
    "PCIE_IPC_MAX_NUMEL_ENV",
    "PCIE_IPC_NO_MODULE",
    "PCIE_IPC_SETUP_FAILED",
    "PCIE_IPC_WORLD_SIZES",
    "PathRule",
    "TORCH_SYMM_MEM_WORLD_SIZES",
    "attention_dp_of",
    "custom_all_reduce_off_line",
    "custom_all_reduce_off_lines",
    "decode_kernel",
    "engages",
    "nvlink_multicast_possible",
    "opt_in_rank_lines",
    "pcie_ipc_switched_on",
    "predict",
    "resolve_fusion_backend",
]

SGLANG_VERSION = "0.5.23"
"""The SGLang version whose source these rules were read from."""

Kernel = Literal["none", "flashinfer_fusion", "custom_all_reduce", "nccl"]

KERNEL_WORDS: dict[str, str] = {
    "none": "no all-reduce (TP 1)",
    "flashinfer_fusion": "FlashInfer's fused all-reduce + RMSNorm",
    "custom_all_reduce": "SGLang's custom all-reduce",
    "nccl": "NCCL",
    "mscclpp": "MSCCL++",
    "nccl_symm_mem": "NCCL on symmetric memory",
    "torch_symm_mem": "PyTorch's symmetric-memory all-reduce",
    "pcie_ipc": "FlashInfer's PCIe-IPC all-reduce",
}
"""What each kernel is, in words for tables and log lines (``Kernel`` and ``DecodeKernel``)."""

DecodeKernel = Literal["none", "flashinfer_fusion", "custom_all_reduce", "nccl", "mscclpp", "nccl_symm_mem",
                       "torch_symm_mem", "pcie_ipc"]
"""``Kernel`` plus the opt-in paths ``decode_kernel`` can answer (``predict`` never does)."""

FUSION_ARCHITECTURES = frozenset({
    "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "DeepseekV4ForCausalLM", "GptOssForCausalLM",
    "GlmMoeDsaForCausalLM", "Glm4MoeForCausalLM", "Glm4MoeLiteForCausalLM", "MistralLarge3ForCausalLM",
    "Qwen3MoeForCausalLM", "Qwen3VLMoeForConditionalGeneration", "Qwen3NextForCausalLM",
    "Qwen4ExpForConditionalGeneration", "KimiK25ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration",
    "InternS2PreviewForConditionalGeneration", "Qwen3_5ForConditionalGeneration", "NemotronHForCausalLM",
    "NemotronHPuzzleForCausalLM", "NemotronH_Omni_Reasoning_V3",
})
"""SGLang 0.5.23's ``_FLASHINFER_ALLREDUCE_FUSION_ARCHS`` (MiMo's own cutedsl rule is not modelled)."""

CUSTOM_ALL_REDUCE_WORLD_SIZES = (2, 4, 6, 8)
"""The legacy ``CustomAllreduce._SUPPORTED_WORLD_SIZES`` (``custom_all_reduce.py:41``): SGLang falls
back to it where ``CustomAllReduceV2`` declines."""

CUSTOM_ALL_REDUCE_V2_WORLD_SIZES: dict[Optional[int], tuple[int, ...]] = {
    9: (2, 3, 4, 5, 6, 7, 8),
    10: (2, 3, 4, 5, 6, 7, 8, 16),
    None: tuple(range(2, 17)),
}
"""``CustomAllReduceV2``'s world sizes by compute capability major (``get_supported_world_sizes``,
``distributed/device_communicators/configs/custom_all_reduce_v2.py:316-340``): sm90's table, sm100's and
sm107's (2-8 and 16), and a default config for 2-16 on every other arch (sm80, sm120; key None)."""

DECLARED_GPU_KINDS = ("cpu", "sm80-nvlink", "sm80-pcie", "sm90-nvlink", "sm90-pcie", "sm100-nvlink", "sm120-pcie")
"""The GPU kinds a spec (``engine.gpu_kind``) or the reference engine (``--reference-gpu-kind``)
names; any ``smNN-nvlink`` / ``smNN-pcie`` parses, these are the ones documented."""

_KIND = re.compile(r"^sm(\d{2,3})-(nvlink|pcie)$")
_DSV4 = "DeepseekV4ForCausalLM"


@dataclass(frozen=True)
class GpuKind:
    """What the rule needs of a node: the GPUs' compute capability major (9 for sm90) and whether
    every GPU pair is NVLink-connected; ``cpu`` has neither (the reference engine on gloo)."""

    name: str
    capability_major: Optional[int]
    full_nvlink: bool

    @classmethod
    def parse(cls, name: str) -> "GpuKind":
        """``sm90-nvlink`` -> GpuKind(9, NVLink); ``cpu`` -> no GPU.

        Raises:
            ValueError: naming the value and the kinds allowed.
        """
        text = str(name).strip().lower()
        if text == "cpu":
            return cls("cpu", None, False)
        match = _KIND.match(text)
        if not match:
            raise ValueError(f"{name!r} is not a GPU kind; use cpu or smNN-nvlink / smNN-pcie "
                             f"(e.g. {', '.join(DECLARED_GPU_KINDS[1:])})")
        return cls(text, int(match.group(1)) // 10, match.group(2) == "nvlink")

    @property
    def cuda(self) -> bool:
        return self.capability_major is not None


def nvlink_multicast_possible(gpu_kind: GpuKind) -> bool:
    """Whether an engine on ``gpu_kind`` can reach NVLink multicast at all: only where every GPU pair is
    NVLink-connected (``-nvlink``). Without NVLink each path that would use it falls back in SGLang 0.5.23:
    ``TorchSymmMemCommunicator`` disables itself when the rendezvous gives no multicast pointer
    (``distributed/device_communicators/torch_symm_mem.py:116-121``); MSCCL++ registers its NVLS algorithms
    only where ``mscclpp.is_nvls_supported()`` (``pymscclpp.py:86-91``, ``:597``); ``--enable-symm-mem`` sets
    ``NCCL_NVLS_ENABLE=1`` (``entrypoints/engine.py:1908-1915``), which NCCL honours only on GPUs whose
    driver reports multicast support (NVSwitch); FlashInfer's MNNVL backend is refused off sm90/sm100
    (``resolve_fusion_backend``). A ``cpu`` kind has no GPU."""
    return gpu_kind.cuda and gpu_kind.full_nvlink


@dataclass(frozen=True)
class AllReducePath:
    """What one engine's decode all-reduce runs on, and why.

    Attributes:
        kernel: The kernel that carries decode's per-layer all-reduce.
        fusion_backend: ``flashinfer_allreduce_fusion_backend`` as SGLang resolves it (None: off).
        custom_all_reduce: Whether SGLang's custom all-reduce engages.
        custom_off_line: The warning every rank logs when custom all-reduce turns itself off (None
            when it engages or was disabled by flag).
        fusion_line: The line SGLang logs about fusion at start (None: it says nothing).
        reason: One sentence for tables and logs.
    """

    kernel: Kernel
    fusion_backend: Optional[str]
    custom_all_reduce: bool
    custom_off_line: Optional[str]
    fusion_line: Optional[str]
    reason: str

    @property
    def nccl_carries_decode(self) -> bool:
        """Whether NCCL variables can change decode's all-reduce (the time a sweep measures)."""
        return self.kernel == "nccl"


def _nvlink_check_line(name: str, supported: tuple[int, ...], *, gpu_kind: GpuKind, world_size: int,
                       nnodes: int) -> Optional[str]:
    """``can_use_custom_all_reduce_with_nvlink`` (``custom_all_reduce_utils.py:442-512``) for class
    ``name``: the warning it logs, or None where it passes (P2P taken to pass)."""
    if nnodes > 1:
        return f"{name} is disabled because this process group spans across nodes."
    if world_size not in supported:
        return (f"{name} is disabled due to an unsupported world size: {world_size}. Supported world sizes: "
                f"{list(supported)}. To silence this warning, specify disable_custom_all_reduce=True explicitly.")
    if world_size > 2 and not gpu_kind.full_nvlink:
        return (f"{name} is disabled because it's not supported on more than two PCIe-only GPUs. To silence "
                "this warning, specify disable_custom_all_reduce=True explicitly.")
    return None


def custom_all_reduce_off_lines(*, gpu_kind: GpuKind, world_size: int, nnodes: int = 1) -> list[str]:
    """The warnings every rank logs when SGLang's custom all-reduce turns itself off on this node, in
    order; empty when it engages (P2P taken to pass) or there is no CUDA.

    ``dispatch_custom_allreduce`` (``custom_all_reduce.py:387-398``) tries ``CustomAllReduceV2`` first:
    silently declined at a world size outside ``CUSTOM_ALL_REDUCE_V2_WORLD_SIZES`` or at two PCIe GPUs
    (it needs full NVLink, ``custom_all_reduce_v2.py:591-597``), with its own line above two PCIe GPUs;
    then the legacy ``CustomAllreduce`` (2, 4, 6, 8; off above two PCIe GPUs), whose line is the last.
    Across nodes V2 needs one NVLink clique and a VMM-backed allocator (``custom_all_reduce_v2.py:589-590``),
    which a declared kind cannot say: assumed absent (the conservative answer: custom all-reduce off,
    and the legacy class's "spans across nodes" line shows it on every rank)."""
    if not gpu_kind.cuda or world_size == 1:
        return []
    lines = []
    v2_sizes = CUSTOM_ALL_REDUCE_V2_WORLD_SIZES.get(gpu_kind.capability_major, CUSTOM_ALL_REDUCE_V2_WORLD_SIZES[None])
    if nnodes == 1 and world_size in v2_sizes:
        line = _nvlink_check_line("CustomAllReduceV2", v2_sizes, gpu_kind=gpu_kind, world_size=world_size, nnodes=1)
        if line is None and gpu_kind.full_nvlink:
            return []  # V2 engages
        if line is not None:
            lines.append(line)
    line = _nvlink_check_line("CustomAllreduce", CUSTOM_ALL_REDUCE_WORLD_SIZES, gpu_kind=gpu_kind,
                              world_size=world_size, nnodes=nnodes)
    return lines + [line] if line is not None else []


def custom_all_reduce_off_line(*, gpu_kind: GpuKind, world_size: int, nnodes: int = 1) -> Optional[str]:
    """The legacy class's warning, the last of ``custom_all_reduce_off_lines`` (the one that says custom
    all-reduce is off for good), or None when custom all-reduce engages or there is no CUDA."""
    lines = custom_all_reduce_off_lines(gpu_kind=gpu_kind, world_size=world_size, nnodes=nnodes)
    return lines[-1] if lines else None


def predict(
    *,
    gpu_kind: GpuKind,
    architecture: Optional[str],
    tp_size: int,
    disable_custom_all_reduce: bool,
    enforce_disable_fusion: bool,
    fusion_backend: Optional[str] = None,
    nnodes: int = 1,
    attention_dp: bool = False,
    moe_a2a_backend: str = "none",
) -> AllReducePath:
    """SGLang 0.5.23's choice for one engine on a node of ``gpu_kind``.

    Fusion is auto-enabled as ``arg_groups/overrides.py:955-1002`` ``_flashinfer_allreduce_fusion_auto_enable``
    does, with one exception not modelled: DeepSeek-V4.1 (config ``model_type`` deepseek_v41, hidden size
    5120) at TP 4 on one Blackwell node keeps custom all-reduce instead (``prefer_custom_dsv41``,
    ``overrides.py:978-990``). Neither is in a declared kind or the architecture name (V4.1 checkpoints
    may name ``DeepseekV4ForCausalLM``), so there fusion is predicted and the reason says what was assumed.

    Args:
        gpu_kind: The node's GPUs.
        architecture: The model's ``architectures[0]`` (config.json); None when unknown, which
            only matters where fusion could apply (then the answer says it assumed no fusion).
        tp_size: Tensor-parallel ranks.
        disable_custom_all_reduce: ``--disable-custom-all-reduce``.
        enforce_disable_fusion: ``--enforce-disable-flashinfer-allreduce-fusion``.
        fusion_backend: ``--flashinfer-allreduce-fusion-backend`` when given (SGLang then keeps it).
        nnodes: Nodes the engine spans.
        attention_dp: Attention data parallelism on (fusion is then not auto-enabled): SGLang tests
            ``attn_dp_size > 1`` (``attention_dp_of`` reads it from the flags).
        moe_a2a_backend: ``--moe-a2a-backend``; fusion is auto-enabled only with ``none``.
    """
    enforce_line = ("FlashInfer allreduce fusion is forcibly disabled via "
                    "--enforce-disable-flashinfer-allreduce-fusion.")
    if tp_size <= 1:  # the enforce-disable pass logs at any TP (overrides.py _enforce_disable_allreduce_fusion)
        return AllReducePath("none", None, False, None, enforce_line if enforce_disable_fusion else None,
                             "one rank: no tensor-parallel all-reduce")
    backend = fusion_backend
    fusion_line = None
    sm90_or_sm100 = gpu_kind.capability_major in (9, 10)
    if (backend is None and architecture in FUSION_ARCHITECTURES and sm90_or_sm100 and not attention_dp
            and (nnodes == 1 or gpu_kind.capability_major == 10) and moe_a2a_backend == "none"):
        backend = "auto"
        fusion_line = f"Auto-enabling FlashInfer AllReduce Fusion (auto) for {architecture}"
    if enforce_disable_fusion:
        backend = None
        fusion_line = enforce_line
    off_line = None if disable_custom_all_reduce else custom_all_reduce_off_line(
        gpu_kind=gpu_kind, world_size=tp_size, nnodes=nnodes)
    custom = gpu_kind.cuda and not disable_custom_all_reduce and off_line is None
    if backend is not None:
        dsv41 = (fusion_backend is None and architecture == _DSV4 and gpu_kind.capability_major == 10
                 and tp_size == 4 and nnodes == 1 and not disable_custom_all_reduce)
        note = (" (assumed not DeepSeek-V4.1 at hidden size 5120, for which SGLang keeps custom all-reduce: "
                "arg_groups/overrides.py:978-990 prefer_custom_dsv41)") if dsv41 else ""
        return AllReducePath("flashinfer_fusion", backend, custom, off_line, fusion_line,
                             f"SGLang turns on FlashInfer fusion for {architecture} on {gpu_kind.name}{note}")
    if custom:
        which = "CustomAllReduceV2" if gpu_kind.full_nvlink else "the legacy CustomAllreduce"
        return AllReducePath("custom_all_reduce", None, True, None, fusion_line,
                             f"custom all-reduce ({which}) engages at TP {tp_size} on {gpu_kind.name}")
    if disable_custom_all_reduce:
        why = "--disable-custom-all-reduce" + (" --enforce-disable-flashinfer-allreduce-fusion" if enforce_disable_fusion
                                               else "")
    elif not gpu_kind.cuda:
        why = "no CUDA: torch.distributed (gloo) stands in for NCCL"
    else:
        why = off_line.split(" To silence")[0] if off_line else "custom all-reduce is off"
    unknown = (architecture is None and sm90_or_sm100 and not enforce_disable_fusion and fusion_backend is None)
    note = " (architecture unknown: assumed no fusion)" if unknown else ""
    return AllReducePath("nccl", None, False, off_line, fusion_line, f"{why}{note}")


def attention_dp_of(flags: Mapping[str, Any]) -> bool:
    """Whether attention runs data parallel under these SGLang flags (by SGLang name): ``attn_dp_size > 1``
    (``runtime_context.py:191-199`` ``attn_dp_enabled_of``), where ``--dp-size N`` with the
    deprecated ``--enable-dp-attention`` resolves to ``attn_dp_size = N`` (``arg_groups/parallel_hook.py:39-61``)."""
    def number(name: str) -> int:
        try:
            return int(flags.get(name) or 1)
        except (TypeError, ValueError):
            return 1

    size = number("attn_dp_size")
    if size == 1 and flags.get("enable_dp_attention"):
        size = number("dp_size")
    return size > 1


# --- the opt-in paths (issue 44) -----------------------------------------------------------------------

OptInPath = Literal["torch_symm_mem", "mscclpp", "nccl_symm_mem", "flashinfer_fusion_backend",
                    "fused_moe_sum_all_reduce", "pcie_ipc"]

FUSION_BACKENDS = ("auto", "trtllm", "mnnvl", "cutedsl")
"""``--flashinfer-allreduce-fusion-backend`` choices in 0.5.23 (``arg_groups/fields/exec_.py``)."""

TORCH_SYMM_MEM_WORLD_SIZES: dict[int, tuple[int, ...]] = {9: (2, 4, 6, 8), 10: (2, 4, 6, 8)}
"""``distributed/device_communicators/all_reduce_utils.py`` ``TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES``
keys (capability major -> world sizes; 64 MiB cap at 2 and 4, 128 MiB at 6 and 8). The flag's help
says "SM90 supports world size 4, 6, 8. SM100 supports world size 6, 8"; the table is what runs."""

MSCCLPP_WORLD_SIZES = (4, 8, 16, 32, 64)
"""``pymscclpp.py`` ``_SUPPORTED_WORLD_SIZES``; one IPC domain (a node) has algorithms for 4, 8, 16
and 32 (``_NATIVE_SUPPORTED_WORLD_SIZES``), several nodes need 2, 4 or 8 IPC domains
(``_MULTI_NODE_IPC_DOMAIN_COUNTS``) and carry 1 KiB to 1 MiB per domain."""

_MSCCLPP_SINGLE_NODE_WORLD_SIZES = (4, 8, 16, 32)

PCIE_IPC_ENV = "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"
"""The variable that switches FlashInfer's PCIe-IPC all-reduce on (``environ.py:1539``, an ``EnvBool``;
its workspace bound is ``SGLANG_PCIE_IPC_MAX_NUMEL``, ``environ.py:1540``). SGLang has no flag for it."""

PCIE_IPC_MAX_NUMEL_ENV = "SGLANG_PCIE_IPC_MAX_NUMEL"


def pcie_ipc_switched_on(environ: Mapping[str, str]) -> bool:
    """``SGLANG_ENABLE_PCIE_IPC_ALLREDUCE`` as SGLang's ``EnvBool`` reads it (``environ.py:143-150``).

    Raises:
        ValueError: a value ``EnvBool`` refuses (SGLang then fails to start), in its words.
    """
    value = environ.get(PCIE_IPC_ENV, "").strip().lower()
    if value in ("true", "1", "yes", "y"):
        return True
    if value in ("", "false", "0", "no", "n"):
        return False
    raise ValueError(f'{PCIE_IPC_ENV}: "{value}" is not a valid boolean value')

PCIE_IPC_WORLD_SIZES = (2, 4, 8)
"""``pcie_ipc_ar.py:77`` ``_SUPPORTED_WORLD_SIZES`` (other sizes: skipped with a DEBUG line only)."""

PCIE_IPC_ENABLED = "FlashInfer PCIe-IPC all-reduce enabled (world=%d, workspace sized on first reduction)"
"""INFO on every rank when ``PcieIpcCommunicator`` comes up (``pcie_ipc_ar.py:240-245``): no proof that
it runs, the workspace is built later."""

PCIE_IPC_BUILT = "FlashInfer PCIe-IPC workspace built (world=%d, max_numel=%d, hidden=%d)"
"""INFO on every rank once the workspace exists (``pcie_ipc_ar.py:297-303``): SGLang builds it in warmup,
before CUDA-graph capture (``model_executor/runner/base_runner.py:350-365``), or lazily at the first
eligible reduction (``pcie_ipc_ar.py:400``)."""

PCIE_IPC_FAILED = "FlashInfer PCIe-IPC workspace (max_numel=%d) failed: %s; reductions stay on NCCL"
"""WARNING when the workspace cannot be built; the communicator stays off (``pcie_ipc_ar.py:286-295``)."""

PCIE_IPC_NO_MODULE = ("SGLANG_ENABLE_PCIE_IPC_ALLREDUCE is set but this FlashInfer build has no pcie_ipc_comm; "
                      "falling back to NCCL all-reduce.")
"""WARNING when FlashInfer lacks ``PcieIpcAllReduceWorkspace`` (``pcie_ipc_ar.py:224-231``)."""

PCIE_IPC_SETUP_FAILED = "Setup FlashInfer PCIe-IPC allreduce failed with {error}."
"""WARNING when the communicator's constructor raises (``parallel_state.py:500-501``)."""

PCIE_IPC_BF16_ONLY = "FlashInfer PCIe-IPC all-reduce serves bf16 only; %s reductions stay on NCCL."
"""WARNING, once per dtype, for reductions that are not bf16 (``pcie_ipc_ar.py:117-123``, ``:396-399``)."""

PCIE_IPC_DETERMINISTIC = ("Deterministic inference is on; leaving PCIe-IPC all-reduce off. Its kernels pick a "
                          "tactic per shape, so the reduction order would follow the batch shape.")
"""WARNING when ``eligible_group`` declines under deterministic inference (``pcie_ipc_ar.py:89-95``, ``:111-113``)."""
_MSCCLPP_IPC_DOMAIN_COUNTS = (2, 4, 8)


@dataclass(frozen=True)
class PathRule:
    """One opt-in path: its flag, where SGLang engages it, and where it ranks.

    Attributes:
        path: The name ``engages`` takes.
        flag: The SGLang 0.5.23 server flag, or ``NAME=1`` for a path an environment variable switches on.
        kernel: The ``DecodeKernel`` it carries decode on (None: it is no all-reduce path).
        source: Where it engages (``sglang/srt/`` file and function).
        precedence: Where it ranks against the other kernels.
        declared_kind_cannot_tell: What the rule needs that a declared ``GpuKind`` does not say.
    """

    path: str
    flag: str
    kernel: Optional[str]
    source: str
    precedence: str
    declared_kind_cannot_tell: str


PATH_RULES: dict[str, PathRule] = {rule.path: rule for rule in (
    PathRule("torch_symm_mem", "--enable-torch-symm-mem", "torch_symm_mem",
             "distributed/device_communicators/torch_symm_mem.py TorchSymmMemCommunicator.__init__ "
             "(capability 9/10, world size in TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES, multicast) and "
             "should_torch_symm_mem_allreduce (bf16, 4-byte aligned, below 64/128 MiB); picked by "
             "distributed/parallel_state.py GroupCoordinator._resolve_outplace_all_reduce_method",
             "after fusion, MSCCL++, custom all-reduce and NCCL symmetric memory; before plain NCCL",
             "whether torch symmetric memory gets a multicast pointer (NVSwitch; assumed for -nvlink, "
             "refused for -pcie), the model's activation dtype, a fabric across nodes"),
    PathRule("mscclpp", "--enable-mscclpp", "mscclpp",
             "distributed/device_communicators/pymscclpp.py PyMscclppCommunicator.__init__ and "
             "should_mscclpp_allreduce; distributed/parallel_state.py GroupCoordinator.all_reduce, "
             "enabled only in GroupCoordinator.graph_capture",
             "after fusion; ahead of custom all-reduce (ca is taken only when MSCCL++ declines)",
             "whether the mscclpp package is installed (SGLang 0.5.23 does not require it), the IPC "
             "domains mscclpp.CommGroup finds, which tuned algorithm wins at start"),
    PathRule("nccl_symm_mem", "--enable-symm-mem", "nccl_symm_mem",
             "distributed/parallel_state.py GroupCoordinator.all_reduce (pynccl_comm and "
             "is_symmetric_memory_enabled(), from distributed/device_communicators/pynccl_allocator.py)",
             "after fusion, MSCCL++ and custom all-reduce; ahead of FlashInfer all-reduce-only and torch "
             "symmetric memory; the kernel is NCCL's, so NCCL variables still reach it",
             "the NCCL version and whether NCCL picks its symmetric kernels for this topology"),
    PathRule("flashinfer_fusion_backend", "--flashinfer-allreduce-fusion-backend", "flashinfer_fusion",
             "layers/flashinfer_comm_fusion.py _resolve_backend / resolve_flashinfer_allreduce_fusion_backend; "
             "model_executor/runner/base_runner.py _pre_initialize_flashinfer_allreduce_workspace",
             "first: it runs at the RMSNorm call site, and distributed/bootstrap.py _set_all_reduce_flags "
             "tags the groups so plain all-reduces take flashinfer_allreduce ahead of custom all-reduce",
             "whether flashinfer.comm's allreduce_fusion API imports; MNNVL fabric on sm100 across nodes"),
    PathRule("pcie_ipc", f"{PCIE_IPC_ENV}=1", "pcie_ipc",
             "distributed/device_communicators/pcie_ipc_ar.py eligible_group (the env set, the tp group, not "
             "deterministic: l.98-114), PcieIpcCommunicator.__init__ (world sizes 2, 4, 8, CUDA, FlashInfer's "
             "PcieIpcAllReduceWorkspace: l.198-245) and should_pcie_ipc_ar (bf16, within the decode-sized "
             "workspace: l.387-404); picked by distributed/parallel_state.py "
             "GroupCoordinator._resolve_outplace_all_reduce_method (l.963-975)",
             "after fusion (and FlashInfer's all-reduce on fusion-tagged groups), MSCCL++, custom all-reduce and "
             "NCCL symmetric memory (parallel_state.py:747-766, 956-975); ahead of torch symmetric memory and plain "
             "NCCL; it does not probe the link, so on NVLink it runs wherever those ahead of it decline",
             "whether the workspace builds (CUDA IPC between the GPUs; across nodes assumed not), how long its "
             "first start tunes (cached per world size: pcie_ipc_ar.py:166-178), the model's activation dtype"),
    PathRule("fused_moe_sum_all_reduce", "--enable-fused-moe-sum-all-reduce", None,
             "layers/moe/moe_runner/triton_utils/fused_moe.py _fused_moe_kernel_sequence "
             "(use_fused_moe_sum_all_reduce: triton MoE, top-k > 2, not int8/int4 w-a16)",
             "none: it sums the top-k expert outputs with atomic adds in the down GEMM; the TP "
             "all-reduce after the MoE layer is chosen as without it",
             "nothing it would need: it never changes the all-reduce kernel"),
)}
"""The five opt-in all-reduce flags of SGLang 0.5.23 and its one opt-in all-reduce variable
(``--enable-nccl-nvls`` is deliberately absent)."""


def resolve_fusion_backend(backend: str, *, gpu_kind: GpuKind, nnodes: int = 1) -> tuple[Optional[str], str]:
    """``_resolve_backend`` (``layers/flashinfer_comm_fusion.py``) for a declared node: the backend
    SGLang runs, or None and the ValueError it raises at start (then SGLang does not start)."""
    multi = nnodes > 1
    major = gpu_kind.capability_major
    if backend not in FUSION_BACKENDS:
        return None, f"{backend!r} is not one of {', '.join(FUSION_BACKENDS)}"
    if major not in (9, 10):
        return None, "FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs."
    if backend == "cutedsl":
        return (backend, "cutedsl on sm100") if major == 10 else (
            None, "FlashInfer allreduce fusion cutedsl backend requires a Blackwell system.")
    if backend == "auto":
        if major == 10:
            return "mnnvl", "auto resolves to mnnvl on sm100"
        if multi:
            return None, "FlashInfer allreduce fusion does not support multi-node on non-Blackwell systems."
        return "trtllm", "auto resolves to trtllm on sm90 single-node"
    if backend == "trtllm" and multi:
        return None, "FlashInfer allreduce fusion trtllm backend supports single-node only."
    if backend == "mnnvl" and not (major == 10 or not multi):
        return None, "FlashInfer allreduce fusion mnnvl backend requires a Blackwell system, or SM90 single-node."
    return backend, f"{backend} on sm{major}0 {'across nodes' if multi else 'single-node'}"


def _torch_symm_mem_up(gpu_kind: GpuKind, world_size: int, nnodes: int, activation_dtype: str) -> tuple[bool, str]:
    src = "torch_symm_mem.py TorchSymmMemCommunicator"
    if gpu_kind.capability_major not in TORCH_SYMM_MEM_WORLD_SIZES:
        return False, f"{src}.__init__ supports capability 9 and 10 only, not {gpu_kind.name}"
    if world_size not in TORCH_SYMM_MEM_WORLD_SIZES[gpu_kind.capability_major]:
        return False, f"{src}.__init__ supports world sizes 2, 4, 6, 8 only, not {world_size}"
    if nnodes > 1:
        return False, (f"{src}.__init__ needs a multicast pointer across the group's nodes, which only an "
                       "MNNVL fabric gives and a declared kind cannot say (assumed absent)")
    if not gpu_kind.full_nvlink:
        return False, f"{src}.__init__ disables itself without multicast, which PCIe GPUs lack"
    if activation_dtype != "bfloat16":
        return False, f"{src}.should_torch_symm_mem_allreduce takes bf16 only, not {activation_dtype}"
    kernel = "multimem" if world_size in (4, 6, 8) else "two-shot"
    return True, (f"{src} comes up ({kernel} kernel; assumes the NVLink node has NVSwitch multicast) and "
                  "takes decode's bf16 messages (below 64/128 MiB)")


def _mscclpp_up(gpu_kind: GpuKind, world_size: int, nnodes: int, installed: bool, cuda_graph: bool) -> tuple[bool, str]:
    src = "pymscclpp.py PyMscclppCommunicator"
    if not installed:
        return False, (f"{src}.__init__ imports mscclpp, which SGLang 0.5.23 does not require; a declared kind "
                       "cannot say it is installed (assumed not: 'PyMscclpp is unavailable')")
    if world_size not in MSCCLPP_WORLD_SIZES:
        return False, f"{src}.__init__ supports world sizes {list(MSCCLPP_WORLD_SIZES)} only, not {world_size}"
    if not cuda_graph:
        return False, f"{src} is enabled only inside GroupCoordinator.graph_capture; decode runs without CUDA graphs"
    if nnodes > 1:
        if nnodes not in _MSCCLPP_IPC_DOMAIN_COUNTS or world_size % nnodes:
            return False, f"{src} across nodes needs 2, 4 or 8 IPC domains, not {nnodes} nodes"
        return True, (f"{src} (allreduce_multi_nodes, 1 KiB to {nnodes} MiB messages) runs in decode's CUDA "
                      "graphs; assumes one IPC domain per node")
    if world_size not in _MSCCLPP_SINGLE_NODE_WORLD_SIZES:
        return False, f"{src} has no single-node algorithm at world size {world_size}"
    if not gpu_kind.full_nvlink:
        return False, (f"{src} on PCIe-only GPUs: whether its IPC memory channels tune to a usable algorithm is "
                       "a runtime fact a declared kind cannot tell (assumed not)")
    return True, f"{src} tunes an algorithm for decode's sizes and runs in decode's CUDA graphs"


def _pcie_ipc_up(gpu_kind: GpuKind, world_size: int, nnodes: int, activation_dtype: str,
                 deterministic: bool) -> tuple[bool, str]:
    src = "pcie_ipc_ar.py PcieIpcCommunicator"
    if not gpu_kind.cuda:
        return False, f"{src}.__init__ returns on a device that is not CUDA (l.221-222)"
    if deterministic:
        return False, "pcie_ipc_ar.py eligible_group leaves it off under deterministic inference (l.111-113)"
    if world_size not in PCIE_IPC_WORLD_SIZES:
        return False, f"{src}.__init__ supports world sizes 2, 4, 8 only, not {world_size} (l.77, l.212-217)"
    if nnodes > 1:
        return False, (f"{src}: its workspace shares GPU memory over CUDA IPC, which does not reach another node; "
                       "SGLang does not check the node count, so the build is assumed to fail ('... failed: ...; "
                       "reductions stay on NCCL')")
    if activation_dtype != "bfloat16":
        return False, f"{src}.should_pcie_ipc_ar takes bf16 only, not {activation_dtype} (l.396-399)"
    return True, (f"{src} comes up (world sizes 2, 4, 8; bf16; FlashInfer 0.7.2 ships PcieIpcAllReduceWorkspace) and "
                  "takes decode's reductions, which its decode-sized workspace admits (should_pcie_ipc_ar, l.387-404)")


def decode_kernel(
    *,
    gpu_kind: GpuKind,
    architecture: Optional[str],
    tp_size: int,
    disable_custom_all_reduce: bool = False,
    enforce_disable_fusion: bool = False,
    fusion_backend: Optional[str] = None,
    nnodes: int = 1,
    attention_dp: bool = False,
    moe_a2a_backend: str = "none",
    enable_torch_symm_mem: bool = False,
    enable_mscclpp: bool = False,
    enable_symm_mem: bool = False,
    enable_fused_moe_sum_all_reduce: bool = False,
    enable_pcie_ipc: bool = False,
    mscclpp_installed: bool = False,
    cuda_graph: bool = True,
    activation_dtype: str = "bfloat16",
    deterministic: bool = False,
) -> tuple[str, str]:
    """The kernel (a ``DecodeKernel``) that carries decode's per-layer all-reduce with the opt-in
    flags as well, and one sentence why. Without them it is ``predict``'s kernel and reason.

    Runtime facts a declared kind cannot know are answered conservatively: mscclpp is taken as not
    installed unless ``mscclpp_installed``; multicast is taken as present on ``-nvlink`` nodes only
    and absent across nodes; PCIe-IPC's workspace as built on one node and not across nodes. Decode's
    messages are taken to fit custom all-reduce's buffer (as in ``predict``). ``enable_pcie_ipc`` is
    ``SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1``; ``deterministic`` is ``--enable-deterministic-inference``.
    ``enable_fused_moe_sum_all_reduce`` changes nothing here (``PATH_RULES``).

    Raises:
        ValueError: ``fusion_backend`` is one SGLang refuses on this node (its message).
    """
    del enable_fused_moe_sum_all_reduce  # fuses the MoE top-k sum, not the TP all-reduce
    if fusion_backend is not None and tp_size > 1 and not enforce_disable_fusion:  # enforce-disable drops it first
        resolved, why = resolve_fusion_backend(fusion_backend, gpu_kind=gpu_kind, nnodes=nnodes)
        if resolved is None:
            raise ValueError(f"SGLang refuses --flashinfer-allreduce-fusion-backend {fusion_backend}: {why}")
    base = predict(gpu_kind=gpu_kind, architecture=architecture, tp_size=tp_size,
                   disable_custom_all_reduce=disable_custom_all_reduce, enforce_disable_fusion=enforce_disable_fusion,
                   fusion_backend=fusion_backend, nnodes=nnodes, attention_dp=attention_dp,
                   moe_a2a_backend=moe_a2a_backend)
    if base.kernel in ("none", "flashinfer_fusion") or not gpu_kind.cuda:
        return base.kernel, base.reason
    declined = []
    if enable_mscclpp:
        up, why = _mscclpp_up(gpu_kind, tp_size, nnodes, mscclpp_installed, cuda_graph)
        if up:
            return "mscclpp", why + ", ahead of custom all-reduce (parallel_state.py GroupCoordinator.all_reduce)"
        declined.append(f"--enable-mscclpp does not engage: {why}")
    if base.kernel == "custom_all_reduce":
        if enable_pcie_ipc:
            declined.append("PCIe-IPC ranks behind custom all-reduce (parallel_state.py:956-975)")
        return base.kernel, _with(base.reason, declined)
    if enable_symm_mem:
        return "nccl_symm_mem", ("parallel_state.py GroupCoordinator.all_reduce sends it to pynccl on symmetric "
                                 f"memory ({base.reason}); NCCL picks its symmetric kernels at run time")
    if enable_pcie_ipc:
        up, why = _pcie_ipc_up(gpu_kind, tp_size, nnodes, activation_dtype, deterministic)
        if up:
            return "pcie_ipc", (f"{why}; it ranks right after custom all-reduce (parallel_state.py:963-975), off "
                                f"here: {base.reason}")
        declined.append(f"{PCIE_IPC_ENV}=1 does not engage: {why}")
    if enable_torch_symm_mem:
        up, why = _torch_symm_mem_up(gpu_kind, tp_size, nnodes, activation_dtype)
        if up:
            return "torch_symm_mem", f"{why} ({base.reason})"
        declined.append(f"--enable-torch-symm-mem does not engage: {why}")
    return base.kernel, _with(base.reason, declined)


def _with(reason: str, declined: list[str]) -> str:
    return "; ".join([reason, *declined])


def opt_in_rank_lines(
    *,
    gpu_kind: GpuKind,
    world_size: int,
    nnodes: int = 1,
    enable_mscclpp: bool = False,
    enable_torch_symm_mem: bool = False,
    mscclpp_installed: bool = False,
    enable_pcie_ipc: bool = False,
    deterministic: bool = False,
) -> list[tuple[str, str]]:
    """The (level, message) lines every TP rank logs at start about the opt-in communicators, as
    SGLang 0.5.23 words them (``pymscclpp.py`` ``PyMscclppCommunicator.__init__``,
    ``torch_symm_mem.py`` ``TorchSymmMemCommunicator.__init__``, ``pcie_ipc_ar.py`` ``eligible_group``
    and ``PcieIpcCommunicator.__init__``), by the rule of ``decode_kernel`` for a declared node. Empty
    at one rank; without CUDA only ``eligible_group``'s deterministic warning (it runs on every device, the
    communicators are built on the GPU only). PCIe-IPC's workspace line
    (``PCIE_IPC_BUILT``) comes later, when the workspace is built. ``serving.engine.all_reduce_observed``
    reads these lines back."""
    lines: list[tuple[str, str]] = []
    if world_size <= 1:
        return lines
    if enable_pcie_ipc and deterministic:  # eligible_group runs on every device, CPU included (parallel_state.py:487)
        lines.append(("warning", PCIE_IPC_DETERMINISTIC))
    if not gpu_kind.cuda:
        return lines
    if enable_pcie_ipc and not deterministic and world_size in PCIE_IPC_WORLD_SIZES:
        lines.append(("info", PCIE_IPC_ENABLED % world_size))
    if enable_mscclpp:
        if not mscclpp_installed:
            lines.append(("warning", "PyMscclpp is unavailable because its dependencies failed to import: "
                                     "No module named 'mscclpp'"))
        elif world_size not in MSCCLPP_WORLD_SIZES:
            lines.append(("warning", f"PyMscclpp is disabled due to an unsupported world size: {world_size}. "
                                     f"Supported world sizes: {list(MSCCLPP_WORLD_SIZES)}. To silence this warning, "
                                     "specify disable_mscclpp=True explicitly."))
        elif _mscclpp_up(gpu_kind, world_size, nnodes, True, True)[0]:
            lines.append(("info", f"Created MSCCL++ communicator: group=tp world_size={world_size} device=cuda "
                                  "allreduce_configs=4 allgather_configs=4"))
        else:
            lines.append(("warning", "PyMscclpp did not produce any usable tuned configurations."))
    if enable_torch_symm_mem:
        major = gpu_kind.capability_major
        prefix = "TorchSymmMemCommunicator: "
        if major not in TORCH_SYMM_MEM_WORLD_SIZES:
            lines.append(("warning", f"{prefix}Device capability {major} not supported, communicator is not available."))
        elif world_size not in TORCH_SYMM_MEM_WORLD_SIZES[major]:
            lines.append(("warning", f"{prefix}World size {world_size} not supported, communicator is not available."))
        elif nnodes > 1 or not gpu_kind.full_nvlink:
            lines.append(("warning", f"{prefix}torch symmetric memory multicast operations are not supported."))
    return lines


_PATH_KWARGS = {"torch_symm_mem": "enable_torch_symm_mem", "mscclpp": "enable_mscclpp",
                "nccl_symm_mem": "enable_symm_mem", "fused_moe_sum_all_reduce": "enable_fused_moe_sum_all_reduce",
                "pcie_ipc": "enable_pcie_ipc"}


def engages(
    path: str,
    *,
    gpu_kind: GpuKind,
    world_size: int,
    nnodes: int = 1,
    architecture: Optional[str] = None,
    disable_custom_all_reduce: bool = False,
    enforce_disable_fusion: bool = False,
    fusion_backend: str = "auto",
    attention_dp: bool = False,
    moe_a2a_backend: str = "none",
    mscclpp_installed: bool = False,
    cuda_graph: bool = True,
    activation_dtype: str = "bfloat16",
) -> tuple[bool, str]:
    """Whether SGLang 0.5.23 runs decode's all-reduce on ``path`` (a ``PATH_RULES`` key) when its
    flag is given on a node of ``gpu_kind``, and one sentence why (citing the source). The other
    arguments are as in ``decode_kernel``; ``fusion_backend`` is the value given with
    ``--flashinfer-allreduce-fusion-backend`` (used for that path only).

    Raises:
        ValueError: ``path`` is not one of ``PATH_RULES``.
    """
    if path not in PATH_RULES:
        raise ValueError(f"{path!r} is not an all-reduce path; use one of {', '.join(PATH_RULES)}")
    rule = PATH_RULES[path]
    if rule.kernel is None:
        return False, (f"{rule.flag} changes no all-reduce kernel: it sums the top-k expert outputs with atomic "
                       "adds in the MoE down GEMM (triton_utils/fused_moe.py _fused_moe_kernel_sequence)")
    common = dict(gpu_kind=gpu_kind, architecture=architecture, tp_size=world_size,
                  disable_custom_all_reduce=disable_custom_all_reduce, nnodes=nnodes, attention_dp=attention_dp,
                  moe_a2a_backend=moe_a2a_backend, mscclpp_installed=mscclpp_installed, cuda_graph=cuda_graph,
                  activation_dtype=activation_dtype)
    if path == "flashinfer_fusion_backend":
        if world_size <= 1:
            return False, "one rank: no tensor-parallel all-reduce"
        if enforce_disable_fusion:
            return False, ("arg_groups/overrides.py _enforce_disable_allreduce_fusion drops the backend "
                           "(--enforce-disable-flashinfer-allreduce-fusion wins)")
        resolved, why = resolve_fusion_backend(fusion_backend, gpu_kind=gpu_kind, nnodes=nnodes)
        if resolved is None:
            return False, f"SGLang refuses to start (flashinfer_comm_fusion.py _resolve_backend): {why}"
        return True, (f"flashinfer_comm_fusion.py _resolve_backend: {why}; the fused all-reduce + RMSNorm "
                      "runs first, and plain all-reduces take flashinfer_allreduce ahead of custom all-reduce "
                      "(bootstrap.py _set_all_reduce_flags); assumes flashinfer.comm imports")
    kernel, why = decode_kernel(enforce_disable_fusion=enforce_disable_fusion, **common,
                                **{_PATH_KWARGS[path]: True})
    if kernel == rule.kernel:
        return True, why
    if path == "torch_symm_mem":
        up, up_why = _torch_symm_mem_up(gpu_kind, world_size, nnodes, activation_dtype)
    elif path == "mscclpp":
        up, up_why = _mscclpp_up(gpu_kind, world_size, nnodes, mscclpp_installed, cuda_graph)
    elif path == "pcie_ipc":
        up, up_why = _pcie_ipc_up(gpu_kind, world_size, nnodes, activation_dtype, False)
    else:
        up, up_why = gpu_kind.cuda and world_size > 1, "pynccl comes up on symmetric memory"
    if not gpu_kind.cuda:
        return False, "no CUDA: GroupCoordinator.all_reduce sends CPU tensors to shm or gloo before any GPU path"
    if up:
        return False, f"{up_why}, but {KERNEL_WORDS.get(kernel, kernel)} ranks ahead of it: {why}"
    return False, up_why
