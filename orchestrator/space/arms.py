"""The all-reduce arms on one node: which kernel each runs, which are one configuration, and where
the NCCL variables can matter.

By SGLang's rule (``serving.all_reduce_rules``) on the spec's node, arms that run one kernel are
measured once (the first in the spec's order stands for them), and NCCL settings are searched only
on arms where NCCL carries decode. With the node unknown nothing is collapsed. Why: see
docs/design/bench-and-spec.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Protocol, Sequence

from orchestrator.space.points import ALL_REDUCE_ARMS, ARM_EXTRA_FLAGS, arm_env, arm_extra_args, arm_flags
from serving.cuda_graph_rules import decode_backend_of
from serving.all_reduce_rules import (
    DECLARED_GPU_KINDS,
    KERNEL_WORDS,
    SGLANG_VERSION,
    GpuKind,
    attention_dp_of,
    decode_kernel,
    nvlink_multicast_possible,
    pcie_ipc_switched_on,
    predict,
    resolve_fusion_backend,
)

__all__ = ["ArmPath", "ArmsOnNode", "EngineNode", "NCCL_KERNELS", "PathRow", "all_reduce_section", "arm_path",
           "arms_on_node", "model_architecture", "multicast_possible", "section_kinds", "table_lines"]

AUTO_KIND = "auto"


class EngineNode(Protocol):
    """What the rule needs of a spec's engine section (``orchestrator.spec.EngineSpec``)."""

    kind: str
    model_path: str
    tp_size: int
    nnodes: int
    gpu_kind: str
    architecture: Optional[str]
    mscclpp_installed: bool
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
class ArmPath:
    """What one arm runs decode's all-reduce on, on one node, by SGLang 0.5.23's rule.

    Attributes:
        kernel: The ``DecodeKernel`` (``serving.all_reduce_rules``) that carries decode.
        fusion_backend: FlashInfer fusion's backend as SGLang resolves it (``auto`` resolved: trtllm
            on sm90, mnnvl on sm100); None without fusion.
        reason: One sentence why, citing SGLang's source where the rule is an opt-in path's.
        custom_off_line: The warning every rank logs when custom all-reduce turns itself off (None
            when it engages or the arm disables it).
        refused: Why SGLang refuses to start with this arm's flags on this node (None: it starts).
    """

    kernel: str
    fusion_backend: Optional[str]
    reason: str
    custom_off_line: Optional[str] = None
    refused: Optional[str] = None

    @property
    def nccl_carries_decode(self) -> bool:
        """Whether NCCL variables can change decode's all-reduce (NCCL's kernel, plain or on
        symmetric memory)."""
        return self.refused is None and self.kernel in NCCL_KERNELS

    @property
    def identity(self) -> tuple[str, Optional[str]]:
        """Arms with one identity run one configuration of decode's all-reduce: measured once."""
        return self.kernel, self.fusion_backend

    @property
    def words(self) -> str:
        """The kernel in words, with the fusion backend where there is one."""
        text = KERNEL_WORDS.get(self.kernel, self.kernel)
        return f"{text} ({self.fusion_backend})" if self.fusion_backend else text


@dataclass(frozen=True)
class PathRow:
    """One row of a node's all-reduce table: the arm, what runs decode's all-reduce with it on the
    node, and what the sweep does with it.

    Attributes:
        arm: The ``search.all_reduce`` arm.
        runs: The kernel in words ("nothing" where SGLang refuses to start).
        status: ``measured``, ``same as X (measured once)``, or ``refused: <SGLang's reason>``.
        reason: Why that kernel runs, citing SGLang's source (``ArmPath.reason``).
        refused: Whether SGLang refuses to start with the arm on the node.
    """

    arm: str
    runs: str
    status: str
    reason: str
    refused: bool = False


def table_lines(rows: Sequence[PathRow], *, gpu_kind: str, indent: str = "  ") -> list[str]:
    """``rows`` as an aligned text table: path | decode's all-reduce on ``gpu_kind`` | sweep."""
    header = ("path", f"decode's all-reduce on {gpu_kind}", "sweep")
    cells = [header, *((row.arm, row.runs, row.status) for row in rows)]
    widths = [max(len(cell[i]) for cell in cells) for i in range(2)]
    return [f"{indent}{a:<{widths[0]}}  {b:<{widths[1]}}  {c}".rstrip() for a, b, c in cells]


def multicast_possible(gpu_kind: str) -> bool:
    """Whether an arm could turn on NVLink multicast on a node of ``gpu_kind`` (``auto``: not known,
    taken as yes). Off NVLink the multicast arms fall back (``serving.all_reduce_rules.nvlink_multicast_possible``),
    so ``search.allow_dangerous`` need not name them there."""
    return gpu_kind == AUTO_KIND or nvlink_multicast_possible(GpuKind.parse(gpu_kind))


NCCL_KERNELS = ("nccl", "nccl_symm_mem")
"""Decode kernels that are NCCL's: the NCCL variables reach them (not ``pcie_ipc``: FlashInfer's own
kernels, ``sglang/srt/distributed/device_communicators/pcie_ipc_ar.py``)."""


@dataclass(frozen=True)
class ArmsOnNode:
    """The arms of one spec on one node.

    Attributes:
        gpu_kind: The node (``None``: not known yet, nothing collapsed).
        paths: Each arm's predicted path, the spec's arms first, then every other arm (empty when
            the node is not known).
        measured: The arms the sweep runs, in the spec's order: one per kernel, none SGLang refuses.
        stands_for: Arm -> the measured arm that runs its kernel (itself when measured); arms SGLang
            refuses on this node are absent (``refused``).
        nccl_arms: Measured arms on which NCCL carries decode (the NCCL settings are searched there).
        refused: Arm -> why SGLang would not start with it on this node (never measured).
    """

    gpu_kind: Optional[str]
    paths: Mapping[str, ArmPath]
    measured: tuple[str, ...]
    stands_for: Mapping[str, str]
    nccl_arms: Optional[tuple[str, ...]]
    refused: Mapping[str, str] = field(default_factory=dict)

    def row(self, arm: str, *, nccl_searched: bool = False) -> PathRow:
        """``arm``'s row of this node's table (any arm of ``paths``); ``nccl_searched``: the spec searches
        NCCL settings, so a measured arm says whether they reach its kernel.

        Raises:
            KeyError: the node is not known, or ``arm`` is not an arm.
        """
        path = self.paths[arm]
        if path.refused is not None:
            return PathRow(arm, "nothing: SGLang does not start", f"refused: {path.refused}", path.reason, True)
        measured_as = self.stands_for.get(arm)
        if measured_as is None:
            status = "not in this spec's search.all_reduce"
        elif measured_as != arm:
            status = f"same as {measured_as} (measured once)"
        elif nccl_searched:
            status = "measured, NCCL settings searched on it" if self.nccl_arms and arm in self.nccl_arms else (
                "measured with NCCL's defaults (its kernel is not NCCL's)")
        else:
            status = "measured"
        return PathRow(arm, path.words, status, path.reason)

    def table(self, *, nccl_searched: bool = False) -> list[PathRow]:
        """One row per arm of the spec, in its order; empty while the node is not known."""
        if self.gpu_kind is None:
            return []
        return [self.row(arm, nccl_searched=nccl_searched) for arm in self.paths
                if arm in self.stands_for or arm in self.refused]

    def default_note(self) -> Optional[str]:
        """Why SGLang's own choice runs what it runs on this node, in one line (None: node not known)."""
        path = self.paths.get("default")
        if self.gpu_kind is None or path is None or path.refused is not None:
            return None
        return f"SGLang's own choice (default) runs {path.words} here: {path.reason}"

    def lines(self) -> list[str]:
        """One line per arm: its kernel on this node, and whether it is measured, stands in, or
        cannot start here."""
        if self.gpu_kind is None:
            return [f"{', '.join(self.stands_for)}: the kernels depend on the node (engine.gpu_kind: auto; the "
                    "preflight reads it; spectune validate --all-nodes shows them on each GPU kind)"]
        out = []
        for arm, path in self.paths.items():
            if arm in self.refused:
                out.append(f"{arm}: SGLang refuses to start with it here ({self.refused[arm]}); not measured")
                continue
            if arm not in self.stands_for:
                continue  # an arm the spec does not search (paths holds every arm, for engine-cmd)
            measured_as = self.stands_for[arm]
            how = "NCCL_* searched here" if self.nccl_arms and arm in self.nccl_arms else (
                "NCCL's defaults only" if not path.nccl_carries_decode else "")
            if measured_as != arm:
                how = f"same kernel as '{measured_as}': measured once, as '{measured_as}'"
            out.append(f"{arm}: {path.words} ({path.reason}){'; ' + how if how else ''}")
        return out


def arm_path(node: GpuKind, arm: str, *, architecture: Optional[str], tp_size: int, nnodes: int,
             extra_args: Mapping[str, Any], mscclpp_installed: bool = False) -> ArmPath:
    """One arm's decode all-reduce on ``node`` (``serving.all_reduce_rules.decode_kernel`` with the
    arm's flags and environment over the spec's fixed ``extra_args``)."""
    flags = {**{name: extra_args[name] for name in ARM_EXTRA_FLAGS if name in extra_args}, **arm_extra_args(arm)}
    switches = arm_flags(arm)
    backend = flags.get("flashinfer_allreduce_fusion_backend")
    # --enforce-disable-flashinfer-allreduce-fusion drops a given backend before SGLang resolves it
    # (arg_groups/overrides.py _enforce_disable_allreduce_fusion)
    enforce_off = switches["enforce_disable_flashinfer_allreduce_fusion"]
    backend = backend if isinstance(backend, str) and not enforce_off else None
    common = dict(gpu_kind=node, architecture=architecture, tp_size=tp_size,
                  disable_custom_all_reduce=switches["disable_custom_all_reduce"],
                  enforce_disable_fusion=switches["enforce_disable_flashinfer_allreduce_fusion"], nnodes=nnodes,
                  attention_dp=attention_dp_of(extra_args),
                  moe_a2a_backend=str(extra_args.get("moe_a2a_backend", "none")))
    base = predict(fusion_backend=backend, **common)
    try:
        kernel, why = decode_kernel(fusion_backend=backend, enable_torch_symm_mem=bool(flags.get("enable_torch_symm_mem")),
                                    enable_mscclpp=bool(flags.get("enable_mscclpp")),
                                    enable_symm_mem=bool(flags.get("enable_symm_mem")),
                                    enable_pcie_ipc=pcie_ipc_switched_on(arm_env(arm)),
                                    deterministic=bool(extra_args.get("enable_deterministic_inference")),
                                    mscclpp_installed=mscclpp_installed,
                                    cuda_graph=decode_backend_of(extra_args) != "disabled", **common)
    except ValueError as exc:
        return ArmPath(base.kernel, None, str(exc), base.custom_off_line, refused=str(exc))
    resolved = None
    if kernel == "flashinfer_fusion" and base.fusion_backend:
        resolved = resolve_fusion_backend(base.fusion_backend, gpu_kind=node, nnodes=nnodes)[0] or base.fusion_backend
    return ArmPath(kernel, resolved, why, base.custom_off_line)


def arms_on_node(engine: EngineNode, arms: Sequence[str], *, gpu_kind: Optional[str] = None) -> ArmsOnNode:
    """The arms of ``arms`` on the node ``gpu_kind`` (default: the spec's ``engine.gpu_kind``).

    Flags the spec fixes in ``engine.extra_args`` take part as SGLang would read them:
    ``flashinfer_allreduce_fusion_backend``, ``attn_dp_size`` (or the deprecated ``dp_size`` with
    ``enable_dp_attention``), ``moe_a2a_backend``, ``enable_deterministic_inference`` and the opt-in path flags; and ``engine.nnodes``: across nodes custom all-reduce turns itself off and
    fusion is not auto-enabled on sm90, so NCCL carries decode there on most arms. Arms that run one
    kernel (and fusion backend) are one configuration: ``default`` stands for the others where it is one
    of them (the baselines run it), else the first in ``arms``.
    Arms SGLang refuses to start with on this node are left out (``refused``).
    """
    kind = gpu_kind or engine.gpu_kind
    if kind == AUTO_KIND:
        return ArmsOnNode(None, {}, tuple(arms), {arm: arm for arm in arms}, None)
    node = GpuKind.parse(kind)
    architecture = model_architecture(engine)
    installed = engine.mscclpp_installed
    paths = {arm: arm_path(node, arm, architecture=architecture, tp_size=engine.tp_size, nnodes=engine.nnodes,
                           extra_args=engine.extra_args, mscclpp_installed=installed)
             for arm in dict.fromkeys([*arms, *ALL_REDUCE_ARMS])}
    refused = {arm: paths[arm].refused for arm in arms if paths[arm].refused}
    first_of_kernel: dict[tuple[str, Optional[str]], str] = {}
    if "default" in arms and "default" not in refused:  # SGLang's own choice, which the baselines run, stands first
        first_of_kernel[paths["default"].identity] = "default"
    stands_for: dict[str, str] = {}
    for arm in arms:
        if arm not in refused:
            stands_for[arm] = first_of_kernel.setdefault(paths[arm].identity, arm)
    measured = tuple(dict.fromkeys(stands_for.values()))
    nccl_arms = tuple(arm for arm in measured if paths[arm].nccl_carries_decode)
    return ArmsOnNode(node.name, paths, measured, stands_for, nccl_arms, refused)  # type: ignore[arg-type]


def section_kinds(spec: Any, *, all_nodes: bool = False) -> list[str]:
    """The node kinds whose all-reduce table a command shows for ``spec`` (an ``orchestrator.spec.SweepSpec``):
    the spec's ``engine.gpu_kind`` (none while ``auto``), and with ``all_nodes`` every declared GPU kind
    after it (``cpu`` only for the reference engine)."""
    kinds = [] if spec.engine.gpu_kind == AUTO_KIND else [spec.engine.gpu_kind]
    if all_nodes:
        kinds += [kind for kind in DECLARED_GPU_KINDS
                  if kind not in kinds and (kind != "cpu" or spec.engine.kind == "reference")]
    return kinds


def all_reduce_section(spec: Any, *, all_nodes: bool = False, indent: str = "  ") -> list[str]:
    """What ``spectune validate`` and the dry run print about the all-reduce arms of ``spec`` (an
    ``orchestrator.spec.SweepSpec``): a title, then one table per node kind of ``section_kinds``
    (path | decode's all-reduce there | measured / same as X / refused) and why SGLang's own choice runs
    what it runs there."""
    engine, search = spec.engine, spec.search
    if engine.tp_size == 1:
        return ["tp_size 1: no tensor-parallel all-reduce"]
    nccl_searched = bool(search.nccl_variables())
    out = [f"search.all_reduce [{', '.join(search.all_reduce)}] as SGLang {SGLANG_VERSION} runs it (each trial "
           "records the kernel its engine ran):"]
    if engine.gpu_kind == AUTO_KIND:
        out.append(f"{indent}the node is not known (engine.gpu_kind: auto): the preflight reads it where the engines run"
                   + ("" if all_nodes else "; --all-nodes shows the table on each GPU kind"))
    for kind in section_kinds(spec, all_nodes=all_nodes):
        plan = spec.arms_on_node(gpu_kind=kind)
        if kind != engine.gpu_kind:
            out.append(f"{indent}if the node were {kind} (--all-nodes):")
        out += table_lines(plan.table(nccl_searched=nccl_searched), gpu_kind=kind, indent=indent)
        note = plan.default_note()
        if note:
            out.append(f"{indent}{note}")
    return out
