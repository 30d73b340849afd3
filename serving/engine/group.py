"""EngineGroup: one engine across ``nnodes`` nodes, an EngineHost actor per node, driven as one.

Each node's host starts its part with ``--nnodes N --node-rank R --dist-init-addr`` (node rank
0's host picks the address). The group's URL is node rank 0's, its audit every node's merged
(``merge_audits``), a dead node is named (``first_gone``), and ``stop`` stops node rank 0 first.
With one node it is exactly one host, with that host's own reports.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

import ray
from ray.util.placement_group import PlacementGroup

from serving.engine.config import EngineConfig
from serving.engine.host import create_engine_host
from serving.engine.placement import EnginePlacement

__all__ = ["EngineGroup", "NodeFailed", "merge_audits", "node_entry"]

logger = logging.getLogger(__name__)

RENDEZVOUS_TIMEOUT_S = 60.0
"""How long node rank 0's host may take to name its rendezvous address (an idle actor: seconds)."""


class NodeFailed(Exception):
    """One node's part of the engine failed (to start, or while running): which node, and why.

    Attributes:
        node_rank: The node's ``--node-rank``.
        node: ``{"node_rank", "node_id", "node_ip"}`` as far as known.
        cause: The exception its host raised (Ray's wrapper removed), or None.
    """

    def __init__(self, node_rank: int, node: Mapping[str, Any], message: str, cause: BaseException | None = None):
        super().__init__(message)
        self.node_rank = node_rank
        self.node = dict(node)
        self.cause = cause


def _cause(exc: BaseException) -> BaseException:
    if isinstance(exc, ray.exceptions.RayTaskError):
        return getattr(exc, "cause", None) or exc
    return exc


def node_entry(info: Mapping[str, Any]) -> dict[str, Any]:
    """What a record keeps of one node's part of an engine (from ``EngineHost.start``'s report)."""
    return {key: info.get(key) for key in ("node_rank", "node_id", "node_ip", "pid", "cuda_visible_devices")}


def node_words(node: Mapping[str, Any]) -> str:
    """``node rank 1 (10.0.0.2, node 3f2a...)`` for messages."""
    where = ", ".join(str(v) for v in (node.get("node_ip"), f"node {node['node_id']}" if node.get("node_id") else None)
                      if v)
    return f"node rank {node.get('node_rank')}" + (f" ({where})" if where else "")


def merge_audits(audits: list[dict[str, Any]], nodes: list[Mapping[str, Any]]) -> dict[str, Any]:
    """Every node's ``AuditReport.to_dict()`` as one: ``ok`` only if every node's is, each process
    tagged with its node's rank and IP, the summary one line per node."""
    processes = [{**p, "node_rank": node.get("node_rank"), "node_ip": node.get("node_ip")}
                 for audit, node in zip(audits, nodes) for p in audit.get("processes", ())]
    ok = bool(audits) and all(a.get("ok") for a in audits)
    lines = [f"{node_words(node)}: {audit.get('summary')}" for audit, node in zip(audits, nodes)]
    head = (f"env audit passed on all {len(nodes)} nodes" if ok else
            f"env audit FAILED on {sum(not a.get('ok') for a in audits)} of {len(nodes)} nodes")
    return {
        "ok": ok,
        "summary": "\n".join([head, *lines]),
        "root_pid": audits[0].get("root_pid") if audits else None,
        "expected": audits[0].get("expected", {}) if audits else {},
        "worker_expected": audits[0].get("worker_expected", {}) if audits else {},
        "processes": processes,
        "nodes": [{**node_entry(node), "ok": a.get("ok"), "summary": a.get("summary")} for a, node in zip(audits, nodes)],
    }


class EngineGroup:
    """The EngineHost actors of one engine, one per node, in ``placement_group``'s bundles.

    After ``start()``: ``info`` (node rank 0's report, with ``nodes`` and the merged ``audit``).
    """

    def __init__(
        self,
        config: EngineConfig,
        *,
        placement: EnginePlacement,
        placement_group: PlacementGroup | None,
        log_dir: str,
        start_timeout_s: float,
        label: str,
        runtime_env_vars: Mapping[str, str] | None = None,
    ) -> None:
        if placement.nnodes != config.nnodes:
            raise ValueError(f"a placement for {placement.nnodes} nodes cannot hold an engine of nnodes={config.nnodes}")
        self.config = config
        self.placement = placement
        self.label = label
        self.hosts = [
            create_engine_host(
                config, log_dir=log_dir, num_gpus=placement.gpus_per_node, placement_group=placement_group,
                bundle_index=placement.host_bundles[rank], start_timeout_s=start_timeout_s, label=label,
                runtime_env_vars=runtime_env_vars, node_rank=rank,
            )
            for rank in range(config.nnodes)
        ]
        self.info: dict[str, Any] = {}
        self._nodes: list[dict[str, Any]] = [{"node_rank": r} for r in range(config.nnodes)]

    @property
    def nnodes(self) -> int:
        return len(self.hosts)

    @property
    def nodes(self) -> list[dict[str, Any]]:
        """What is known of each node's part (``node_entry``), by node rank."""
        return [dict(n) for n in self._nodes]

    def start(self) -> dict[str, Any]:
        """Start every node's part, wait until all are healthy; return node rank 0's report with
        ``nodes`` (``node_entry`` per node) and, across nodes, the merged ``audit``.

        Raises:
            NodeFailed: the first node's part that failed to start (the other hosts are killed at
                once). One node: its host's own exception instead.
        """
        if self.nnodes == 1:
            info = ray.get(self.hosts[0].start.remote())
            self._nodes = [node_entry(info)]
            self.info = {**info, "nodes": self.nodes}
            return self.info
        address = ray.get(self.hosts[0].rendezvous_address.remote(), timeout=RENDEZVOUS_TIMEOUT_S)
        logger.info("%s: starting an engine across %d nodes (rendezvous at %s)", self.label, self.nnodes, address)
        ranks = {host.start.remote(address): rank for rank, host in enumerate(self.hosts)}
        reports: dict[int, dict[str, Any]] = {}
        pending = list(ranks)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            rank = ranks[done[0]]
            try:
                reports[rank] = ray.get(done[0])
            except Exception as exc:  # noqa: BLE001 - named and re-raised below
                cause = _cause(exc)
                self.kill(except_rank=rank)
                raise NodeFailed(rank, self._nodes[rank], f"{self.label}: node rank {rank} of {self.nnodes} did not "
                                 f"start: {cause}", cause) from None
            self._nodes[rank] = node_entry(reports[rank])
        first = reports[0]
        audit = merge_audits([reports[r]["audit"] for r in range(self.nnodes)], self.nodes)
        self.info = {**first, "nodes": self.nodes, "audit": audit}
        return self.info

    def health(self, *, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """Each node's ``EngineHost.health()``; a host that cannot answer reads ``alive`` False with
        ``host_gone`` (its node or its actor is lost, and the engine with it)."""
        out = []
        for rank, host in enumerate(self.hosts):
            try:
                out.append(ray.get(host.health.remote(), timeout=timeout_s))
            except Exception as exc:  # noqa: BLE001 - a host that cannot answer has lost its engine too
                out.append({"alive": False, "healthy": False, "detail": f"engine host unreachable: {_cause(exc)}",
                            "node_rank": rank, "exited_at": None, "host_gone": True})
        return out

    def first_gone(self, health: list[dict[str, Any]] | None = None) -> dict[str, Any] | None:
        """The node whose engine died first (``node_entry`` plus ``detail``), or None if every node's
        engine runs; a lost host counts as first, then the earliest ``exited_at``."""
        health = self.health() if health is None else health
        gone = [h for h in health if not h.get("alive")]
        if not gone:
            return None
        first = min(gone, key=lambda h: (not h.get("host_gone"), h.get("exited_at") or float("inf"), h["node_rank"]))
        return {**self._nodes[first["node_rank"]], "node_rank": first["node_rank"], "detail": first.get("detail")}

    def log_text(self) -> str:
        """The engine log: one node's own, or every node's, each under a line naming its node."""
        if self.nnodes == 1:
            return ray.get(self.hosts[0].log_text.remote(), timeout=60)
        parts = []
        for rank, host in enumerate(self.hosts):
            try:
                text = ray.get(host.log_text.remote(), timeout=60)
            except Exception as exc:  # noqa: BLE001 - a lost node's log is lost; the others are kept
                text = f"(log not readable: {_cause(exc)})\n"
            # serving.engine.nccl_log keys processes by this header
            parts.append(f"===== {node_words(self._nodes[rank])} =====\n{text}")
        return "\n".join(parts)

    def stop(self, *, timeout_s: float = 180.0) -> dict[str, Any]:
        """Stop node rank 0's part first, then every other node's, each host proving its node clean.
        Returns ``{"nodes": [stop report per node]}`` (one node: its report itself).

        Raises:
            The first host's failure (after every node was asked to stop).
        """
        reports: list[Any] = []
        first_error: BaseException | None = None
        for rank, host in enumerate(self.hosts):
            try:
                reports.append(ray.get(host.stop.remote(), timeout=timeout_s))
            except Exception as exc:  # noqa: BLE001 - the other nodes are still stopped
                reports.append({"error": str(_cause(exc))})
                first_error = first_error or exc
        if first_error is not None:
            raise first_error
        return reports[0] if self.nnodes == 1 else {"nodes": reports}

    def kill(self, *, except_rank: int | None = None) -> None:
        """Kill every host actor (their engines die with them: ``die_with_parent``)."""
        for rank, host in enumerate(self.hosts):
            if rank != except_rank:
                ray.kill(host, no_restart=True)
