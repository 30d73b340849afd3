"""A Serve replica's engine when it spans nodes: an EngineGroup with the face of an EngineProcess.

The replica drives one EngineHost per node (its child actors, in its placement group's bundles);
this class gives it what it uses of an EngineProcess: ``url`` (node rank 0's API), ``pid``,
``log_path``, ``check_healthy`` (every node's engine), ``stop`` and an audit of every node.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

import ray

from serving.engine.config import EngineConfig
from serving.engine.group import EngineGroup, merge_audits, node_words
from serving.engine.placement import EnginePlacement
from serving.engine.process import StopReport
from serving.errors import EngineDied, EngineNotReady

__all__ = ["EngineAcrossNodes", "MergedAudit"]

logger = logging.getLogger(__name__)


class MergedAudit:
    """Every node's audit as one, with the face of ``AuditReport`` (``ok``, ``summary()``, ``to_dict()``)."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    @property
    def ok(self) -> bool:
        return bool(self.data.get("ok"))

    def summary(self) -> str:
        return str(self.data.get("summary", ""))

    def to_dict(self) -> dict[str, Any]:
        return dict(self.data)


class EngineAcrossNodes:
    """The EngineHost of every node of one engine, started and stopped as one (see the module)."""

    def __init__(self, config: EngineConfig, *, placement: EnginePlacement, log_dir: Path, start_timeout_s: float,
                 label: str) -> None:
        self.config = config
        self.placement = placement
        self.log_dir = Path(log_dir or tempfile.gettempdir())
        self.start_timeout_s = start_timeout_s
        self.label = label
        self.group: EngineGroup | None = None
        self.info: dict[str, Any] = {}

    def start(self) -> None:
        """Create the hosts in the replica's placement group and start every node's part; returns
        once all are healthy (so ``wait_healthy`` has nothing left to wait for).

        Raises:
            NodeFailed: a node's part did not start (the message names it).
        """
        self.group = EngineGroup(
            self.config, placement=self.placement, placement_group=ray.util.get_current_placement_group(),
            log_dir=str(self.log_dir), start_timeout_s=self.start_timeout_s, label=self.label,
        )
        try:
            self.info = self.group.start()
        except BaseException:
            self.group.kill()
            raise

    def wait_healthy(self) -> None:
        """Nothing: ``start`` returned once every node was healthy."""

    @property
    def url(self) -> str:
        return self.info["url"]

    @property
    def pid(self) -> int:
        return int(self.info["pid"])

    @property
    def log_path(self) -> str:
        return str(self.info.get("log_path"))

    @property
    def nodes(self) -> list[dict[str, Any]]:
        return list(self.info.get("nodes") or [])

    def audit(self) -> MergedAudit:
        """Every node's process tree audited now, merged."""
        assert self.group is not None
        audits = [ray.get(host.audit.remote(), timeout=60) for host in self.group.hosts]
        return MergedAudit(merge_audits(audits, self.nodes))

    def check_healthy(self, *, timeout_s: float = 10.0) -> None:
        """Raise unless every node's engine is alive and healthy (Serve's ``check_health``).

        Raises:
            EngineDied: a node's engine exited (the first to, named).
            EngineNotReady: every node's engine is alive, but one is not healthy.
        """
        assert self.group is not None
        health = self.group.health(timeout_s=max(timeout_s, 1.0))
        gone = self.group.first_gone(health)
        if gone is not None:
            raise EngineDied(f"{self.label}: the engine died on {node_words(gone)} ({gone.get('detail')})")
        sick = [h for h in health if not h.get("healthy")]
        if sick:
            raise EngineNotReady(f"{self.label}: node rank {sick[0]['node_rank']} is not healthy ({sick[0].get('detail')})")

    def stop(self) -> StopReport:
        """Stop every node's part (node rank 0 first), each host proving its node clean; kill the hosts."""
        if self.group is None:
            return StopReport(exit_code=None, escalated=False, stopped_pids=())
        group, self.group = self.group, None
        try:
            report = group.stop()
        finally:
            group.kill()
        nodes = report.get("nodes", [report])
        pids = tuple(pid for node in nodes for pid in node.get("stopped_pids", ()))
        return StopReport(exit_code=nodes[0].get("exit_code"), escalated=any(n.get("escalated") for n in nodes),
                          stopped_pids=pids)

    def stop_quietly(self) -> None:
        try:
            self.stop()
        except Exception:  # noqa: BLE001 - a failed start is already being reported
            logger.warning("%s: stopping the engine across nodes failed", self.label, exc_info=True)
