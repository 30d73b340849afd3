"""Where one engine's parts go: the placement-group bundles of a trial (or a replica), and the
bundle each node's EngineHost takes.

One node: bundle 0 is the caller's CPUs, bundle 1 the engine's GPUs (``STRICT_PACK``); a CPU engine's
host shares bundle 0. Across nodes: a bundle per node (``STRICT_SPREAD``), bundle 0 the caller's
CPUs and node rank 0's GPUs, bundle ``r`` node rank ``r``'s GPUs (one CPU without GPUs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

__all__ = ["EnginePlacement", "engine_placement", "placements_that_fit"]


@dataclass(frozen=True)
class EnginePlacement:
    """A placement group's bundles and strategy, and which bundle node rank ``r``'s host takes.

    Attributes:
        bundles: Ray placement-group bundles (bundle 0 is the caller's).
        strategy: ``STRICT_PACK`` (one node) or ``STRICT_SPREAD`` (a node per bundle).
        host_bundles: ``host_bundles[r]`` is the bundle index of node rank ``r``'s EngineHost.
        gpus_per_node: GPUs each node's host reserves (``gpus / nnodes``).
    """

    bundles: tuple[dict[str, float], ...]
    strategy: str
    host_bundles: tuple[int, ...]
    gpus_per_node: int

    @property
    def nnodes(self) -> int:
        return len(self.host_bundles)

    def rank_node_need(self) -> dict[str, float]:
        """What a node must hold to run some rank of the engine: the whole group on one node
        (``STRICT_PACK``), or the smallest host bundle of a spread one."""
        if self.strategy != "STRICT_SPREAD":
            total: dict[str, float] = {}
            for bundle in self.bundles:
                for name, amount in bundle.items():
                    total[name] = total.get(name, 0.0) + amount
            return total
        return dict(min((self.bundles[i] for i in self.host_bundles), key=lambda b: (b.get("GPU", 0.0), b.get("CPU", 0.0))))

    def describe(self) -> str:
        """``2 GPUs and 4 CPUs`` or ``2 nodes of 8 GPUs (+4 CPUs on the first)``, for humans."""
        cpus = sum(b.get("CPU", 0.0) for b in self.bundles)
        if self.nnodes == 1:
            return f"{self.gpus_per_node:g} GPUs and {cpus:g} CPUs"
        return (f"{self.nnodes} nodes of {self.gpus_per_node:g} GPUs "
                f"(+{self.bundles[0].get('CPU', 0.0):g} CPUs on the first)")


def engine_placement(*, gpus: int, cpus: float, nnodes: int = 1) -> EnginePlacement:
    """The placement of one engine of ``gpus`` GPUs over ``nnodes`` nodes, with ``cpus`` CPUs for its caller.

    Raises:
        ValueError: ``nnodes`` < 1, or ``gpus`` does not split evenly over ``nnodes``.
    """
    if nnodes < 1:
        raise ValueError(f"nnodes={nnodes}: an engine runs on at least one node")
    if gpus % nnodes:
        raise ValueError(f"{gpus} GPUs do not split evenly over nnodes={nnodes} (every node holds as many ranks)")
    per_node = gpus // nnodes
    if nnodes == 1:
        if gpus > 0:
            return EnginePlacement(({"CPU": float(cpus)}, {"GPU": float(gpus)}), "STRICT_PACK", (1,), gpus)
        return EnginePlacement(({"CPU": float(cpus)},), "STRICT_PACK", (0,), 0)
    first: dict[str, float] = {"CPU": float(cpus)}
    rest: dict[str, float] = {"GPU": float(per_node)} if per_node else {"CPU": 1.0}
    if per_node:
        first["GPU"] = float(per_node)
    return EnginePlacement((first, *[dict(rest) for _ in range(nnodes - 1)]), "STRICT_SPREAD",
                           tuple(range(nnodes)), per_node)


def _fits(node: Mapping[str, float], bundle: Mapping[str, float]) -> bool:
    return all(node.get(name, 0.0) + 1e-9 >= amount for name, amount in bundle.items() if amount > 0)


def placements_that_fit(nodes: Sequence[Mapping[str, float]], placement: EnginePlacement, *, most: int = 1) -> int:
    """How many copies of ``placement`` (up to ``most``) the nodes' free resources hold at once.

    Greedy (bundles largest first, on the first node with room): it can say "no" where a cleverer
    packing would fit, never "yes" where nothing would.
    """
    free = [dict(node) for node in nodes]
    placed = 0
    while placed < most:
        taken: list[tuple[dict[str, float], dict[str, float]]] = []
        if placement.strategy == "STRICT_SPREAD":
            used: set[int] = set()
            for bundle in sorted(placement.bundles, key=lambda b: (-b.get("GPU", 0.0), -b.get("CPU", 0.0))):
                index = next((i for i, n in enumerate(free) if i not in used and _fits(n, bundle)), None)
                if index is None:
                    break
                used.add(index)
                taken.append((free[index], bundle))
            ok = len(taken) == len(placement.bundles)
        else:
            total = placement.rank_node_need()
            node = next((n for n in free if _fits(n, total)), None)
            ok = node is not None
            if node is not None:
                taken.append((node, total))
        if not ok:
            return placed
        for node, bundle in taken:
            for name, amount in bundle.items():
                node[name] = node.get(name, 0.0) - amount
        placed += 1
    return placed
