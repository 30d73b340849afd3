"""Tensor-parallel plumbing: the all-reduce the model calls, and the control-message broadcast.

Tensors go through ``torch.distributed`` (gloo on CPU, NCCL on CUDA); control messages go from
rank 0 over a separate gloo group, as SGLang's ``broadcast_pyobj`` on its CPU group.
"""

from __future__ import annotations

import datetime
import logging
import pickle
from typing import Any, Protocol

import torch

__all__ = ["Comm", "PcieIpcStandIn", "SingleRank", "TorchDistributed"]

logger = logging.getLogger(__name__)


class Comm(Protocol):
    """What the model and scheduler need from the TP group."""

    rank: int
    world_size: int

    def all_reduce(self, tensor: torch.Tensor) -> None:
        """Sum ``tensor`` in place across ranks."""

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (other ranks pass anything)."""


class SingleRank:
    """TP size 1: nothing to reduce or broadcast."""

    rank = 0
    world_size = 1

    def all_reduce(self, tensor: torch.Tensor) -> None:
        return None

    def broadcast_object(self, obj: Any) -> Any:
        return obj


class TorchDistributed:
    """A ``torch.distributed`` process group: ``backend`` for tensors, gloo for control.

    Args:
        rank: This process's rank.
        world_size: Number of ranks.
        init_method: Rendezvous URL (``tcp://127.0.0.1:PORT``).
        backend: "gloo" (CPU) or "nccl" (CUDA).
        device: Device of this rank's tensors.
        timeout_s: Collective timeout (rank 0's idle heartbeat stays well inside it).
    """

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        init_method: str,
        backend: str,
        device: torch.device,
        timeout_s: float = 3600.0,
    ) -> None:
        import torch.distributed as dist

        self._dist = dist
        self.rank = rank
        self.world_size = world_size
        self.device = device
        timeout = datetime.timedelta(seconds=timeout_s)
        kwargs: dict[str, Any] = {}
        if backend == "nccl":
            kwargs["device_id"] = device
        dist.init_process_group(
            backend=backend,
            init_method=init_method,
            rank=rank,
            world_size=world_size,
            timeout=timeout,
            **kwargs,
        )
        self._control = dist.new_group(backend="gloo", timeout=timeout) if backend != "gloo" else None
        self._size = torch.zeros(1, dtype=torch.int64)
        logger.info(
            "torch.distributed ready: rank=%d world_size=%d backend=%s", rank, world_size, backend
        )

    def all_reduce(self, tensor: torch.Tensor) -> None:
        self._dist.all_reduce(tensor)

    def broadcast_object(self, obj: Any) -> Any:
        """Broadcast a picklable object: its length first, then the bytes (skipped if empty)."""
        group = self._control
        if self.rank == 0:
            payload = pickle.dumps(obj) if obj is not None else b""
            self._size[0] = len(payload)
        self._dist.broadcast(self._size, src=0, group=group)
        size = int(self._size[0])
        if size == 0:
            return None
        raw = bytearray(payload) if self.rank == 0 else bytearray(size)
        buf = torch.frombuffer(raw, dtype=torch.uint8)
        self._dist.broadcast(buf, src=0, group=group)
        return obj if self.rank == 0 else pickle.loads(raw)

    def barrier(self) -> None:
        self._dist.barrier(group=self._control)

    def destroy(self) -> None:
        try:
            self._dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - best effort at exit; the process is going away
            logger.debug("destroy_process_group failed", exc_info=True)



class PcieIpcStandIn:
    """SGLang's FlashInfer PCIe-IPC all-reduce on a declared node: the sums stay ``inner``'s (as the
    kernel's equal NCCL's); what it adds are SGLang's per-rank lines (``serving.all_reduce_rules``'
    ``PCIE_IPC_*``, ``sglang/srt/distributed/device_communicators/pcie_ipc_ar.py:247-305``).

    The workspace is built at the first reduction that reaches it, sized ``max_rows x hidden`` (or
    ``max_numel``), logging ``PCIE_IPC_BUILT``; with ``fail`` (the ``pcie_ipc_build_fails`` fault) it logs
    ``PCIE_IPC_FAILED`` instead and stays off, as SGLang's reductions then stay on NCCL. (SGLang
    builds it in the model runner's warm-up, before CUDA-graph capture, or at the first eligible
    reduction; here the first reduction stands for both.)
    """

    def __init__(self, inner: Comm, *, max_rows: int, max_numel: int = 0, fail: bool = False) -> None:
        self.inner = inner
        self.rank = inner.rank
        self.world_size = inner.world_size
        self.max_rows = max_rows
        self.max_numel = max_numel
        self.fail = fail
        self.built: bool | None = None  # None: not tried yet

    def all_reduce(self, tensor: torch.Tensor) -> None:
        if self.built is None:
            from serving.all_reduce_rules import PCIE_IPC_BUILT, PCIE_IPC_FAILED

            hidden = int(tensor.shape[-1])
            max_numel = self.max_numel or self.max_rows * hidden
            if self.fail:
                logger.warning(PCIE_IPC_FAILED, max_numel, "fault pcie_ipc_build_fails: the workspace build raised")
            else:
                logger.info(PCIE_IPC_BUILT, self.world_size, max_numel, hidden)
            self.built = not self.fail
        self.inner.all_reduce(tensor)

    def broadcast_object(self, obj: Any) -> Any:
        return self.inner.broadcast_object(obj)
