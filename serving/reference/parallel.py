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

__all__ = ["Comm", "SingleRank", "TorchDistributed"]

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

