"""The all-reduce arms on one node: which kernel each runs, which are one configuration, and where
the NCCL variables can matter.

By SGLang's rule (``serving.all_reduce_rules``) on the spec's node, arms that run one kernel are
measured once (the first in the spec's order stands for them), and NCCL settings are searched only
on arms where NCCL carries decode. With the node unknown nothing is collapsed. Why: see
docs/design/bench-and-spec.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Protocol, Sequence

from orchestrator.space.points import ALL_REDUCE_ARMS, arm_flags
from serving.all_reduce_rules import KERNEL_WORDS, AllReducePath, GpuKind, predict

__all__ = ["ArmsOnNode", "EngineNode", "arms_on_node", "model_architecture"]

AUTO_KIND = "auto"


class EngineNode(Protocol):
    """What the rule needs of a spec's engine section (``orchestrator.spec.EngineSpec``)."""

    kind: str
    model_path: str
    tp_size: int
    nnodes: int
    gpu_kind: str
    architecture: Optional[str]
    extra_args: Mapping[str, Any]


def model_architecture(engine: EngineNode) -> Optional[str]:
    """``architectures[0]`` as SGLang would read it: the spec's ``engine.architecture``, else (the
    reference engine) ``--json-model-override-args`` or its preset's; None when unknown (an SGLang
    model whose config.json the preflight has not read)."""
    if engine.architecture:
        return engine.architecture
    overrides = engine.extra_args.get("json_model_override_args")
    if isinstance(overrides, str):
        try:
            names = json.loads(overrides).get("architectures")
        except (ValueError, AttributeError):
            names = None
        if isinstance(names, list) and names and isinstance(names[0], str):
            return names[0]
    if engine.kind == "reference":
        from serving.reference.config import PRESETS

        preset = PRESETS.get(engine.model_path)
        return preset.architecture if preset is not None else None
    return None


@dataclass(frozen=True)
class ArmsOnNode:
    """The arms of one spec on one node.

    Attributes:
        gpu_kind: The node (``None``: not known yet, nothing collapsed).
        paths: Each arm's predicted path (empty when the node is not known).
        measured: The arms the sweep runs, in the spec's order: one per kernel.
        stands_for: Arm -> the measured arm that runs its kernel (itself when measured).
        nccl_arms: Measured arms on which NCCL carries decode (the NCCL settings are searched there).
    """

    gpu_kind: Optional[str]
    paths: Mapping[str, AllReducePath]
    measured: tuple[str, ...]
    stands_for: Mapping[str, str]
    nccl_arms: Optional[tuple[str, ...]]

    def lines(self) -> list[str]:
        """One line per arm: its kernel on this node, and whether it is measured or stands in."""
        if self.gpu_kind is None:
            return [f"{', '.join(self.stands_for)}: the kernels depend on the node (engine.gpu_kind: auto; the "
                    "preflight reads it; spectune sweep --dry-run shows them on a PCIe and an NVLink node)"]
        out = []
        for arm, measured_as in self.stands_for.items():
            path = self.paths[arm]
            how = "NCCL_* searched here" if self.nccl_arms and arm in self.nccl_arms else (
                "NCCL's defaults only" if path.kernel != "nccl" else "")
            if measured_as != arm:
                how = f"same kernel as '{measured_as}': measured once, as '{measured_as}'"
            out.append(f"{arm}: {KERNEL_WORDS[path.kernel]} ({path.reason}){'; ' + how if how else ''}")
        return out


def arms_on_node(engine: EngineNode, arms: Sequence[str], *, gpu_kind: Optional[str] = None) -> ArmsOnNode:
    """The arms of ``arms`` on the node ``gpu_kind`` (default: the spec's ``engine.gpu_kind``).

    Flags the spec fixes in ``engine.extra_args`` take part as SGLang would read them:
    ``flashinfer_allreduce_fusion_backend``, ``enable_dp_attention`` and ``moe_a2a_backend``; and
    ``engine.nnodes``: across nodes custom all-reduce turns itself off and fusion is not
    auto-enabled on sm90, so NCCL carries decode there on every arm.
    """
    kind = gpu_kind or engine.gpu_kind
    if kind == AUTO_KIND:
        return ArmsOnNode(None, {}, tuple(arms), {arm: arm for arm in arms}, None)
    node = GpuKind.parse(kind)
    extra = engine.extra_args
    backend = extra.get("flashinfer_allreduce_fusion_backend")
    paths = {
        arm: predict(
            gpu_kind=node, architecture=model_architecture(engine), tp_size=engine.tp_size,
            disable_custom_all_reduce=arm_flags(arm)["disable_custom_all_reduce"],
            enforce_disable_fusion=arm_flags(arm)["enforce_disable_flashinfer_allreduce_fusion"],
            fusion_backend=backend if isinstance(backend, str) else None, nnodes=engine.nnodes,
            attention_dp=bool(extra.get("enable_dp_attention")),
            moe_a2a_backend=str(extra.get("moe_a2a_backend", "none")),
        )
        for arm in ALL_REDUCE_ARMS
    }
    first_of_kernel: dict[str, str] = {}
    stands_for: dict[str, str] = {}
    for arm in arms:
        stands_for[arm] = first_of_kernel.setdefault(paths[arm].kernel, arm)
    measured = tuple(dict.fromkeys(stands_for.values()))
    nccl_arms = tuple(arm for arm in measured if paths[arm].nccl_carries_decode)
    return ArmsOnNode(node.name, paths, measured, stands_for, nccl_arms)
