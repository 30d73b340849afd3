"""The KV cache: one ``[rows, cols, heads, head_dim]`` tensor per layer for keys and for values.

A row holds one running request, a column a token position; columns past a request's committed
length are speculative scratch. The draft shares the target's tensors. Memory grows on demand
(doubling, up to the maximum) unless allocated whole for CUDA graphs.
"""

from __future__ import annotations

import logging

import torch

__all__ = ["KVCache", "cache_cols"]

logger = logging.getLogger(__name__)


def cache_cols(*, context_length: int, scratch: int) -> int:
    """Positions one row holds: the context, the speculative scratch past it, and one spare."""
    return context_length + scratch + 1


def _grow(current: int, needed: int, *, minimum: int, maximum: int) -> int:
    size = max(current, minimum)
    while size < needed:
        size *= 2
    return min(size, maximum)


class KVCache:
    """Per-layer key/value tensors for this TP rank's heads.

    Args:
        num_layers: Layers that write KV (all of the target's).
        num_heads: Heads on this rank.
        head_dim: Per-head width.
        max_rows: Most requests held at once (``--max-running-requests``).
        max_cols: Most positions per request (context length + speculative scratch).
        dtype: Element type.
        device: Where the tensors live.
    """

    def __init__(
        self,
        *,
        num_layers: int,
        num_heads: int,
        head_dim: int,
        max_rows: int,
        max_cols: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.max_rows = max_rows
        self.max_cols = max_cols
        self.dtype = dtype
        self.device = device
        self.rows = 0
        self.cols = 0
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []

    def reserve(self, *, rows: int, cols: int) -> None:
        """Make room for ``rows`` requests of up to ``cols`` positions (copying what is held).

        Raises:
            ValueError: more than ``max_rows`` / ``max_cols`` was asked for.
        """
        if rows > self.max_rows or cols > self.max_cols:
            raise ValueError(
                f"KV cache request ({rows} rows x {cols} cols) exceeds its limit "
                f"({self.max_rows} x {self.max_cols})"
            )
        if rows <= self.rows and cols <= self.cols:
            return
        new_rows = _grow(self.rows, rows, minimum=4, maximum=self.max_rows)
        new_cols = _grow(self.cols, cols, minimum=128, maximum=self.max_cols)
        shape = (new_rows, new_cols, self.num_heads, self.head_dim)
        # zeros, not empty: attention multiplies masked positions by 0, and 0 * NaN is NaN.
        new_k = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.num_layers)]
        new_v = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.num_layers)]
        if self.rows and self.cols:
            for old, new in zip(self.k + self.v, new_k + new_v):
                new[: self.rows, : self.cols].copy_(old)
        self.k, self.v = new_k, new_v
        logger.debug("KV cache grown to %d rows x %d cols", new_rows, new_cols)
        self.rows, self.cols = new_rows, new_cols

    def allocate_whole(self) -> None:
        """Allocate every row and column now, so the tensors never move (CUDA graphs)."""
        self.reserve(rows=self.max_rows, cols=self.max_cols)

    def write(self, layer: int, rows: torch.Tensor, cols: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store ``k``/``v`` (``[T, heads, head_dim]``) at positions ``(rows[i], cols[i])``."""
        self.k[layer][rows, cols] = k
        self.v[layer][rows, cols] = v

    def move_row(self, *, src: int, dst: int, length: int) -> None:
        """Copy the first ``length`` positions of row ``src`` into row ``dst`` (compaction)."""
        if src == dst or length == 0:
            return
        for tensor in self.k + self.v:
            tensor[dst, :length].copy_(tensor[src, :length])

    def move_cols(self, *, rows: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy position ``src[i]`` to ``dst[i]`` within row ``rows[i]`` (accepted draft tokens).

        The source is read in full before anything is written, so overlapping moves are safe.
        """
        if rows.numel() == 0:
            return
        for tensor in self.k + self.v:
            tensor[rows, dst] = tensor[rows, src]
