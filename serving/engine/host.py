"""EngineHost: the Ray actor that owns one engine's GPUs and runs its EngineProcess.

The trial's NCCL variables travel in the actor's ``runtime_env`` (``env_vars``): Ray puts them in
the actor process's environment, the engine subprocess inherits them, and the engine's TP workers
inherit them from it. The host deliberately does *not* add the variables to the launch itself, so
a variable that did not arrive through Ray is caught by the audit instead of being papered over.

Ray sets CUDA_VISIBLE_DEVICES for the actor from ``num_gpus``; the engine inherits it. The actor
never initialises CUDA itself (it does not import torch), so the engine gets the GPUs whole.
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from serving.engine.audit import AuditReport, audit_process_tree
from serving.engine.command import engine_managed_env
from serving.engine.config import EngineConfig
from serving.engine.process import EngineProcess
from serving.errors import EngineNotReady

__all__ = ["EngineHost", "create_engine_host", "engine_host_options"]

logger = logging.getLogger(__name__)


class EngineHost:
    """Owns one engine for its whole life: start, audit, health, stop.

    Use ``create_engine_host`` to make the Ray actor; the class itself is plain Python, so its
    logic is the same in and out of Ray.
    """

    def __init__(
        self, *, config: dict[str, Any], log_dir: str, start_timeout_s: float = 600.0, label: str = "engine"
    ) -> None:
        """Keep the configuration; nothing starts until ``start()``.

        Args:
            config: ``EngineConfig.model_dump()`` (plain data crosses Ray's boundary cleanly).
            log_dir: Directory for the engine log (on the node that runs the actor).
            start_timeout_s: How long the engine may take to become healthy.
            label: Names this engine in logs (e.g. the trial id).
        """
        self.config = EngineConfig.model_validate(config)
        self.log_dir = Path(log_dir)
        self.start_timeout_s = start_timeout_s
        self.label = label
        self._engine: EngineProcess | None = None

    def start(self) -> dict[str, Any]:
        """Launch the engine, wait until healthy, audit its process tree.

        Returns:
            ``{"url", "pid", "log_path", "cuda_visible_devices", "audit"}`` where ``audit`` is
            ``AuditReport.to_dict()``. The caller decides what a failed audit means (the sweep
            fails the trial with reason ``env_audit``).

        Raises:
            EngineLaunchError: the engine died or was not healthy in time (it is stopped first).
        """
        if self._engine is not None:
            raise EngineNotReady(f"{self.label}: engine already started (pid {self._engine.pid})")
        engine = EngineProcess.from_config(
            self.config,
            log_dir=self.log_dir,
            start_timeout_s=self.start_timeout_s,
            apply_env=False,
            die_with_parent=True,
        )
        engine.start()
        self._engine = engine
        try:
            engine.wait_healthy()
        except BaseException:
            self._engine = None
            engine.stop_quietly()
            raise
        report = self._audit()
        if report.ok:
            logger.info("%s: %s", self.label, report.summary())
        else:
            logger.warning("%s: %s", self.label, report.summary())
        return {
            "url": engine.url,
            "pid": engine.pid,
            "log_path": str(engine.log_path),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "audit": report.to_dict(),
        }

    def _audit(self) -> AuditReport:
        engine = self._require()
        return audit_process_tree(
            root_pid=engine.pid,
            expected=dict(self.config.env),
            worker_expected=engine_managed_env(self.config),
        )

    def audit(self) -> dict[str, Any]:
        """Audit the running engine again (``AuditReport.to_dict()``)."""
        return self._audit().to_dict()

    def health(self) -> dict[str, Any]:
        """One health check: ``{"alive", "healthy", "detail"}``."""
        return asdict(self._require().health())

    def url(self) -> str:
        """Base URL of the engine."""
        return self._require().url

    def log_tail(self, lines: int = 40) -> str:
        """Last lines of the engine log."""
        return self._require().log_tail(lines)

    def stop(self) -> dict[str, Any]:
        """Stop the engine and prove nothing of it is left (see ``EngineProcess.stop``)."""
        engine, self._engine = self._engine, None
        if engine is None:
            return {"exit_code": None, "escalated": False, "stopped_pids": []}
        return asdict(engine.stop())

    def _require(self) -> EngineProcess:
        if self._engine is None:
            raise EngineNotReady(f"{self.label}: engine not started")
        return self._engine

    def __del__(self) -> None:
        # Best effort when Ray tears the actor down gracefully; a SIGKILLed actor cannot run
        # this, which is why the engine is started with die_with_parent (PR_SET_PDEATHSIG).
        try:
            self.stop()
        except Exception:  # noqa: BLE001 - nothing can be reported from a finaliser
            pass


def engine_host_options(
    config: EngineConfig,
    *,
    num_gpus: int,
    placement_group: PlacementGroup | None = None,
    bundle_index: int = -1,
) -> dict[str, Any]:
    """Ray actor options for an EngineHost of ``config``.

    Args:
        config: The engine configuration; its ``env`` becomes the runtime_env's ``env_vars``.
        num_gpus: GPUs to reserve: ``tp_size`` for a GPU engine, 0 for the CPU reference engine
            (required: a wrong default either starves the engine or hangs a CPU-only cluster).
        placement_group: Reserve inside this placement group (the trial's), in ``bundle_index``.
        bundle_index: Bundle of the placement group holding the engine's GPUs.
    """
    options: dict[str, Any] = {
        "num_cpus": 0,
        "num_gpus": num_gpus,
        "runtime_env": {"env_vars": dict(config.env)},
        "max_restarts": 0,
    }
    if placement_group is not None:
        options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
            placement_group=placement_group, placement_group_bundle_index=bundle_index
        )
    return options


def create_engine_host(
    config: EngineConfig,
    *,
    log_dir: str | Path,
    num_gpus: int,
    start_timeout_s: float = 600.0,
    label: str = "engine",
    placement_group: PlacementGroup | None = None,
    bundle_index: int = -1,
) -> ray.actor.ActorHandle:
    """Create the EngineHost actor (not yet started: call ``.start.remote()``)."""
    actor_class = ray.remote(EngineHost)
    options = engine_host_options(
        config, num_gpus=num_gpus, placement_group=placement_group, bundle_index=bundle_index
    )
    return actor_class.options(**options).remote(
        config=config.model_dump(), log_dir=str(log_dir), start_timeout_s=start_timeout_s, label=label
    )
