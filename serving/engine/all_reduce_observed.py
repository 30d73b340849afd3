"""Which kernel a running engine's decode all-reduce is on, read from the engine, never assumed.

Sources (SGLang 0.5.23, and the reference engine alike): ``/server_info``'s resolved server args
(``build_server_info``), and the per-rank lines of the engine log that custom all-reduce is off
(``custom_all_reduce_utils.py``) or failed to set up (``parallel_state.py``), that MSCCL++ came up
(``pymscclpp.py``: "Created MSCCL++ communicator"), that PyTorch's symmetric-memory communicator
is not available (``torch_symm_mem.py``), and that FlashInfer's PCIe-IPC workspace was built or not
(``pcie_ipc_ar.py``). The precedence is ``serving.all_reduce_rules``'.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from serving.all_reduce_rules import (
    PCIE_IPC_BUILT,
    PCIE_IPC_FAILED,
    PCIE_IPC_NO_MODULE,
    PCIE_IPC_SETUP_FAILED,
)
from serving.cuda_graph_rules import decode_backend_of
from serving.engine.log_lines import rank_lines

__all__ = ["ObservedAllReduce", "observe_all_reduce", "server_args_of"]

_CUSTOM_OFF = ("CustomAllreduce is disabled", "Setup Custom allreduce failed")
_MSCCLPP_UP = "Created MSCCL++ communicator"
_TORCH_SYMM_MEM_OFF = "TorchSymmMemCommunicator: "  # every line it logs at start says it is not available


def _stem(line: str) -> str:
    """A SGLang log line up to its first placeholder: what every instance of it starts with."""
    return line.split("%")[0].split("{")[0]


_PCIE_IPC_BUILT = _stem(PCIE_IPC_BUILT)  # "enabled" is not proof: the workspace is built later, or fails
# SGLang's fallback lines; "serves bf16 only" is not one: it names one dtype's reductions, which may be
# others than decode's bf16 ones
_PCIE_IPC_OFF = tuple(_stem(line) for line in (PCIE_IPC_FAILED, PCIE_IPC_NO_MODULE, PCIE_IPC_SETUP_FAILED))


@dataclass(frozen=True)
class ObservedAllReduce:
    """What the running engine's decode all-reduce is on, with what showed it.

    Attributes:
        kernel: ``flashinfer_fusion``, ``mscclpp``, ``custom_all_reduce``, ``nccl_symm_mem``,
            ``pcie_ipc``, ``torch_symm_mem``, ``nccl`` or ``none`` (TP 1); ``mixed`` when some ranks logged a
            communicator up (or custom all-reduce off) and others did not;
            ``unknown`` when the engine reported no server args.
        fusion_backend: ``flashinfer_allreduce_fusion_backend`` from ``/server_info``.
        disable_custom_all_reduce: From ``/server_info``.
        ranks_custom_off: Ranks whose log says custom all-reduce is off.
        ranks_in_log: Ranks seen in the log at all (a rank that logged nothing proves nothing).
        evidence: One sentence: what decided the kernel.
    """

    kernel: str
    fusion_backend: Optional[str] = None
    disable_custom_all_reduce: Optional[bool] = None
    ranks_custom_off: list[int] = field(default_factory=list)
    ranks_in_log: list[int] = field(default_factory=list)
    evidence: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def server_args_of(info: Any) -> dict[str, Any]:
    """The server args in a ``/server_info`` answer: its top level, or ``internal_states[0]``
    for the fields the top level lacks (older SGLang repeated them there)."""
    if not isinstance(info, dict):
        return {}
    states = info.get("internal_states")
    first = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}
    return {**first, **info}


def observe_all_reduce(*, server_info: Any, log_text: str, tp_size: int) -> ObservedAllReduce:
    """Read the kernel of decode's all-reduce from ``/server_info`` and the engine's log.

    Fusion and ``--disable-custom-all-reduce`` come from the server args; custom all-reduce engaged
    unless a rank logged it off (the legacy kernel logs nothing when it works). PCIe-IPC carries what
    custom all-reduce and NCCL symmetric memory leave only where every rank logged its workspace built
    and none that it failed or is missing from FlashInfer (``PCIE_IPC_*``); otherwise SGLang fell back
    to NCCL.
    """
    args = server_args_of(server_info)
    if tp_size <= 1:
        return ObservedAllReduce("none", evidence="tp_size 1: no tensor-parallel all-reduce")
    if not args:
        return ObservedAllReduce("unknown", evidence="the engine's /server_info gave no server args")
    backend = args.get("flashinfer_allreduce_fusion_backend")
    disabled = args.get("disable_custom_all_reduce")
    ranks_seen: set[int] = set()
    ranks_off: set[int] = set()
    ranks_mscclpp: set[int] = set()
    ranks_torch_off: set[int] = set()
    ranks_pcie_built: set[int] = set()
    ranks_pcie_off: set[int] = set()
    for rank, line in rank_lines(log_text):
        if rank is None:
            continue
        ranks_seen.add(rank)
        if any(marker in line for marker in _CUSTOM_OFF):
            ranks_off.add(rank)
        if _MSCCLPP_UP in line:
            ranks_mscclpp.add(rank)
        if _TORCH_SYMM_MEM_OFF in line:
            ranks_torch_off.add(rank)
        if _PCIE_IPC_BUILT in line:
            ranks_pcie_built.add(rank)
        if any(marker in line for marker in _PCIE_IPC_OFF):
            ranks_pcie_off.add(rank)
    every = set(range(tp_size))
    pcie_ipc = ranks_pcie_built >= every and not ranks_pcie_off
    fell_back = (f"; ranks {sorted(ranks_pcie_off)} logged PCIe-IPC falling back to NCCL" if ranks_pcie_off else
                 f"; only ranks {sorted(ranks_pcie_built)} logged the PCIe-IPC workspace built"
                 if ranks_pcie_built and not pcie_ipc else "")
    common = dict(fusion_backend=backend, disable_custom_all_reduce=disabled, ranks_custom_off=sorted(ranks_off),
                  ranks_in_log=sorted(ranks_seen))
    if backend:
        return ObservedAllReduce("flashinfer_fusion", **common,
                                 evidence=f"/server_info flashinfer_allreduce_fusion_backend={backend}")
    emulated = args.get("reference_gpu_kind")  # the reference engine's declared node decides, not its device
    on_cpu = emulated == "cpu" or (emulated is None and args.get("device") == "cpu")
    if args.get("enable_mscclpp") and not on_cpu and not _decode_graphs_off(args):
        if ranks_mscclpp and ranks_mscclpp >= every:
            return ObservedAllReduce("mscclpp", **common, evidence=f"/server_info enable_mscclpp=true and every rank "
                                     f"logged '{_MSCCLPP_UP}' ({len(ranks_mscclpp)} ranks), no fusion")
        if not ranks_seen >= every:
            return ObservedAllReduce("unknown", **common, evidence="enable_mscclpp=true, but not every rank is in the "
                                     "log, so whether MSCCL++ came up on each is not shown")
        if ranks_mscclpp:
            return ObservedAllReduce("mixed", **common, evidence=f"ranks {sorted(ranks_mscclpp)} logged "
                                     f"'{_MSCCLPP_UP}', the others did not")
    if disabled and not (args.get("enable_symm_mem") or args.get("enable_torch_symm_mem") or pcie_ipc):
        return ObservedAllReduce("nccl", **common,
                                 evidence="/server_info disable_custom_all_reduce=true, no fusion" + fell_back)
    if on_cpu:
        return ObservedAllReduce("nccl", **common, evidence="/server_info: a CPU node, no custom all-reduce; "
                                 "torch.distributed's gloo stands in for NCCL")
    if ranks_off and not ranks_off >= every:
        return ObservedAllReduce("mixed", **common,
                                 evidence=f"ranks {sorted(ranks_off)} logged custom all-reduce off, the others did not")
    custom_off = bool(disabled) or (ranks_off and ranks_off >= every)
    if not custom_off:
        seen = f"ranks {min(ranks_seen)}-{max(ranks_seen)} in the log" if ranks_seen else "no rank lines in the log"
        return ObservedAllReduce("custom_all_reduce", **common,
                                 evidence=f"no rank logged custom all-reduce off ({seen}), no fusion")
    off_why = ("/server_info disable_custom_all_reduce=true" if disabled
               else f"every rank logged 'CustomAllreduce is disabled' ({len(ranks_off)} ranks)")
    if args.get("enable_symm_mem"):
        return ObservedAllReduce("nccl_symm_mem", **common,
                                 evidence=f"{off_why}; /server_info enable_symm_mem=true: NCCL on symmetric memory")
    if pcie_ipc:
        return ObservedAllReduce("pcie_ipc", **common, evidence=f"{off_why}; every rank logged '{_PCIE_IPC_BUILT}' "
                                 f"({len(ranks_pcie_built)} ranks) and none a PCIe-IPC fallback")
    if args.get("enable_torch_symm_mem"):
        if not ranks_torch_off and ranks_seen >= every:
            return ObservedAllReduce("torch_symm_mem", **common, evidence=f"{off_why}; /server_info "
                                     "enable_torch_symm_mem=true and no rank logged the communicator unavailable")
        if ranks_torch_off and not ranks_torch_off >= every:
            return ObservedAllReduce("mixed", **common, evidence=f"ranks {sorted(ranks_torch_off)} logged "
                                     "TorchSymmMemCommunicator unavailable, the others did not")
        if not ranks_torch_off:
            return ObservedAllReduce("unknown", **common, evidence=f"{off_why}; enable_torch_symm_mem=true, but not "
                                     "every rank is in the log, so whether its communicator came up is not shown")
        return ObservedAllReduce("nccl", **common, evidence=f"{off_why}; every rank logged TorchSymmMemCommunicator "
                                 "unavailable")
    return ObservedAllReduce("nccl", **common, evidence=off_why + fell_back)


def _decode_graphs_off(args: dict[str, Any]) -> bool:
    """Whether decode runs without CUDA graphs (MSCCL++ is used only inside graph capture): SGLang
    0.5.23's resolved ``cuda_graph_config.decode.backend`` where ``/server_info`` has it (resolution
    hooks turn decode graphs off only there), else the flags."""
    config = args.get("cuda_graph_config")
    decode = config.get("decode") if isinstance(config, dict) else None
    if isinstance(decode, dict) and decode.get("backend"):
        return decode["backend"] == "disabled"
    return decode_backend_of(args) == "disabled"
