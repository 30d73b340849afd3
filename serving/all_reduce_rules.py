"""Which kernel carries decode's tensor-parallel all-reduce: SGLang 0.5.23's rule, written once.

In precedence order (sources under ``sglang/srt/``):

* FlashInfer's fused all-reduce + RMSNorm: ``arg_groups/overrides.py``
  ``_flashinfer_allreduce_fusion_auto_enable`` (off by ``_enforce_disable_allreduce_fusion``);
* SGLang's custom all-reduce: ``distributed/device_communicators/custom_all_reduce_utils.py``
  ``can_use_custom_all_reduce_with_nvlink``;
* otherwise NCCL.

``predict`` answers from a declared ``GpuKind``; ``serving.engine.all_reduce_observed`` reads what
a running engine did.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, Optional

__all__ = [
    "AllReducePath",
    "CUSTOM_ALL_REDUCE_WORLD_SIZES",
    "DECLARED_GPU_KINDS",
    "FUSION_ARCHITECTURES",
    "GpuKind",
    "Kernel",
    "KERNEL_WORDS",
    "custom_all_reduce_off_line",
    "predict",
]

SGLANG_VERSION = "0.5.23"
"""The SGLang version whose source these rules were read from."""

Kernel = Literal["none", "flashinfer_fusion", "custom_all_reduce", "nccl"]

KERNEL_WORDS: dict[str, str] = {
    "none": "no all-reduce (TP 1)",
    "flashinfer_fusion": "FlashInfer's fused all-reduce + RMSNorm",
    "custom_all_reduce": "SGLang's custom all-reduce",
    "nccl": "NCCL",
}
"""What each kernel is, in words for tables and log lines."""

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
"""``CustomAllreduce._SUPPORTED_WORLD_SIZES`` in 0.5.23."""

DECLARED_GPU_KINDS = ("cpu", "sm80-nvlink", "sm80-pcie", "sm90-nvlink", "sm90-pcie", "sm100-nvlink", "sm120-pcie")
"""The GPU kinds a spec (``engine.gpu_kind``) or the reference engine (``--reference-gpu-kind``)
names; any ``smNN-nvlink`` / ``smNN-pcie`` parses, these are the ones documented."""

_KIND = re.compile(r"^sm(\d{2,3})-(nvlink|pcie)$")


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


def custom_all_reduce_off_line(*, gpu_kind: GpuKind, world_size: int, nnodes: int = 1) -> Optional[str]:
    """The warning ``can_use_custom_all_reduce_with_nvlink`` logs on every rank when custom all-reduce
    turns itself off on this node, or None when it engages (P2P taken to pass) or there is no CUDA."""
    name = "CustomAllreduce"
    if not gpu_kind.cuda or world_size == 1:
        return None
    if nnodes > 1:
        return f"{name} is disabled because this process group spans across nodes."
    if world_size not in CUSTOM_ALL_REDUCE_WORLD_SIZES:
        return (f"{name} is disabled due to an unsupported world size: {world_size}. Supported world sizes: "
                f"{list(CUSTOM_ALL_REDUCE_WORLD_SIZES)}. To silence this warning, specify "
                "disable_custom_all_reduce=True explicitly.")
    if world_size > 2 and not gpu_kind.full_nvlink:
        return (f"{name} is disabled because it's not supported on more than two PCIe-only GPUs. To silence "
                "this warning, specify disable_custom_all_reduce=True explicitly.")
    return None


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

    Args:
        gpu_kind: The node's GPUs.
        architecture: The model's ``architectures[0]`` (config.json); None when unknown, which
            only matters where fusion could apply (then the answer says it assumed no fusion).
        tp_size: Tensor-parallel ranks.
        disable_custom_all_reduce: ``--disable-custom-all-reduce``.
        enforce_disable_fusion: ``--enforce-disable-flashinfer-allreduce-fusion``.
        fusion_backend: ``--flashinfer-allreduce-fusion-backend`` when given (SGLang then keeps it).
        nnodes: Nodes the engine spans.
        attention_dp: Attention data parallelism on (fusion is then not auto-enabled).
        moe_a2a_backend: ``--moe-a2a-backend``; fusion is auto-enabled only with ``none``.
    """
    if tp_size <= 1:
        return AllReducePath("none", None, False, None, None, "one rank: no tensor-parallel all-reduce")
    backend = fusion_backend
    fusion_line = None
    sm90_or_sm100 = gpu_kind.capability_major in (9, 10)
    if (backend is None and architecture in FUSION_ARCHITECTURES and sm90_or_sm100 and not attention_dp
            and (nnodes == 1 or gpu_kind.capability_major == 10) and moe_a2a_backend == "none"):
        backend = "auto"
        fusion_line = f"Auto-enabling FlashInfer AllReduce Fusion (auto) for {architecture}"
    if enforce_disable_fusion:
        backend = None
        fusion_line = ("FlashInfer allreduce fusion is forcibly disabled via "
                       "--enforce-disable-flashinfer-allreduce-fusion.")
    off_line = None if disable_custom_all_reduce else custom_all_reduce_off_line(
        gpu_kind=gpu_kind, world_size=tp_size, nnodes=nnodes)
    custom = gpu_kind.cuda and not disable_custom_all_reduce and off_line is None
    if backend is not None:
        return AllReducePath("flashinfer_fusion", backend, custom, off_line, fusion_line,
                             f"SGLang turns on FlashInfer fusion for {architecture} on {gpu_kind.name}")
    if custom:
        return AllReducePath("custom_all_reduce", None, True, None, fusion_line,
                             f"custom all-reduce engages at TP {tp_size} on {gpu_kind.name}")
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
