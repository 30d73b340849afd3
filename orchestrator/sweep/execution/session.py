"""EngineSession: one engine's life inside a trial's placement group, from host actor to shipped log.

Shared by a trial (``trial``) and a confirmation visit (``visit_worker``): EngineHost actors pinned
to the engine's bundles (one per node, driven by ``serving.engine.group.EngineGroup``), start,
audit, time limit, teardown with proof, log. Every way the engine can fail to come up is a
:class:`TrialFailure` with a reason tag.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import ray

from serving.engine.config import EngineConfig
from serving.engine.group import EngineGroup, NodeFailed, node_words
from serving.engine.placement import EnginePlacement
from serving.environ import ENV
from serving.waiting import wait_until

__all__ = ["EngineSession", "TrialFailure", "launch_failure_reason", "step_failure"]

logger = logging.getLogger(__name__)


class TrialFailure(Exception):
    """Ends a trial with a reason tag (one of ``FAILURE_REASONS``) and a message."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def _cause(exc: BaseException) -> BaseException:
    """The exception raised inside an actor method, out of Ray's wrapper."""
    if isinstance(exc, ray.exceptions.RayTaskError):
        return getattr(exc, "cause", None) or exc
    return exc


class EngineSession:
    """One engine's EngineHost actors (one per node) and the engine: create, start, audit; stop,
    prove, ship the log. ``open()`` / ``close()``, or a context manager (docs/design/sweep.md says
    why the trial calls them itself).

    After ``open()``: ``group`` (the hosts), ``host`` (node rank 0's actor handle), ``info`` (what
    node rank 0's ``EngineHost.start`` reported: url, pid, log path, node; with ``nodes``, one
    entry per node, and the ``audit`` of every node), ``url``, ``audit`` and ``audit_ok``.
    After ``close()``: ``stop_error`` and ``teardown_problem``.
    """

    def __init__(
        self,
        engine_config: EngineConfig,
        *,
        session_id: str,
        label: str,
        sweep_name: str,
        placement: EnginePlacement,
        start_timeout_s: float,
        time_limit_s: float | None = None,
        timings: dict[str, float] | None = None,
        ship_log: Callable[[str], None] | None = None,
    ) -> None:
        """Prepare (not start) a session; nothing is created until ``open()``.

        Args:
            engine_config: The engine to run.
            session_id: The trial's (or visit's) id: names the engine log directory.
            label: Names the engine in log lines (``"trial 3"``).
            sweep_name: The sweep, for the engine log directory.
            placement: The bundles of this task's placement group and which one each node's host
                takes (``serving.engine.placement.engine_placement``).
            start_timeout_s: How long the engine may take to become healthy.
            time_limit_s: Kill the host actor this long after it was created, and call the
                failure ``timeout`` (see ``timed_out``); None: no limit.
            timings: Where ``engine_start`` and ``teardown`` (seconds) are written: the trial's.
            ship_log: Called once with the engine log after the engine stopped; None: the log
                is not read at all.
        """
        self.engine_config = engine_config
        self.session_id = session_id
        self.label = label
        self.sweep_name = sweep_name
        self.placement = placement
        self.start_timeout_s = start_timeout_s
        self.time_limit_s = time_limit_s
        self.timings = {} if timings is None else timings
        self.ship_log = ship_log
        self.group: EngineGroup | None = None
        self.info: dict[str, Any] = {}
        self.stop_error: BaseException | None = None
        self._timed_out = threading.Event()
        self._timer: threading.Timer | None = None
        self._closed = False

    # --- what the steps read -----------------------------------------------------------------

    @property
    def host(self) -> Any:
        """Node rank 0's EngineHost actor (None before ``open()``)."""
        return self.group.hosts[0] if self.group is not None else None

    @property
    def nodes(self) -> list[dict[str, Any]]:
        """One entry per node of the engine: node rank, Ray node id and IP, pid, GPUs."""
        return self.info.get("nodes") or (self.group.nodes if self.group is not None else [])

    def log_text(self) -> str:
        """The engine log as it is now: every node's (``EngineGroup.log_text``)."""
        assert self.group is not None
        return self.group.log_text()

    @property
    def url(self) -> str:
        """Base URL of the running engine."""
        return self.info["url"]

    @property
    def audit(self) -> dict[str, Any]:
        """The env audit of the engine's process tree (``AuditReport.to_dict()``)."""
        return self.info["audit"]

    @property
    def expected_env(self) -> dict[str, Any]:
        """The variables the audit expected in the engine's processes, its workers' included."""
        audit = self.audit
        return {**audit.get("expected", {}), **audit.get("worker_expected", {})}

    @property
    def audit_ok(self) -> bool:
        """Every process of the engine carries the variables it should."""
        return bool(self.audit["ok"])

    @property
    def timed_out(self) -> bool:
        """The time limit passed and the host was killed: whatever failed since, failed of that."""
        return self._timed_out.is_set()

    @property
    def teardown_problem(self) -> str | None:
        """What went wrong stopping the engine, in words; None if it stopped and was proven gone,
        or if its host was gone already (killed at the time limit: there was nothing to stop)."""
        if self.stop_error is None:
            return None
        cause = _cause(self.stop_error)
        if isinstance(cause, ray.exceptions.RayActorError):
            return None
        return f"engine teardown failed: {cause}"

    def check_audit(self) -> None:
        """Raise ``env_audit`` unless every engine process carries its environment.

        Raises:
            TrialFailure: the audit failed (its summary names the processes and variables).
        """
        if not self.audit_ok:
            raise TrialFailure("env_audit", self.audit.get("summary") or "env audit failed")

    # --- lifecycle ---------------------------------------------------------------------------

    def open(self) -> None:
        """Create the host actors in this task's placement group, start the time limit, start the
        engine (healthy and audited).

        Raises:
            TrialFailure: the engine never served (``timeout`` once the time limit passed, else
                :func:`launch_failure_reason` of the error). Call ``close()`` either way.
        """
        self.group = self._create_hosts()
        if self.time_limit_s is not None:
            self._timer = threading.Timer(self.time_limit_s, self._on_time_limit)
            self._timer.daemon = True
            self._timer.start()
        tic = time.monotonic()
        try:
            self.info = self.group.start()
        except NodeFailed as failed:  # an engine across nodes: the node is named in the message
            cause = failed.cause if failed.cause is not None else failed
            reason = "timeout" if self.timed_out else launch_failure_reason(cause)
            raise TrialFailure(reason, str(failed)) from None
        except Exception as exc:  # noqa: BLE001 - every launch failure is a recorded result
            cause = _cause(exc)
            reason = "timeout" if self.timed_out else launch_failure_reason(cause)
            raise TrialFailure(reason, str(cause)) from None
        finally:
            self.timings["engine_start"] = time.monotonic() - tic

    def close(self) -> None:
        """Stop the engine, prove nothing is left, kill the host, ship the log (once; a second
        call does nothing). A failed stop is kept in ``stop_error``, never raised."""
        if self._closed:
            return
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        if self.group is None:
            return
        tic = time.monotonic()
        log_text = ""
        try:
            try:
                self.info["stop"] = self.group.stop(timeout_s=180)
            except Exception as exc:  # noqa: BLE001 - kept for the caller: the trial records it, a visit logs it
                self.stop_error = exc
            if self.ship_log is not None:
                log_text = self._read_log()
        finally:
            self.group.kill()
        self.timings["teardown"] = time.monotonic() - tic
        if log_text:
            assert self.ship_log is not None
            try:
                self.ship_log(log_text)
            except Exception:  # noqa: BLE001 - losing the log must not lose the trial's record
                logger.warning("%s: could not store the engine log", self.label, exc_info=True)

    def __enter__(self) -> "EngineSession":
        try:
            self.open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- parts -------------------------------------------------------------------------------

    def _create_hosts(self) -> EngineGroup:
        """The EngineHost actors in this task's placement group, each in its node's bundle."""
        pg = ray.util.get_current_placement_group()
        delivered = dict(self.engine_config.env)
        fault = ENV.SPECTUNE_SWEEP_FAULT.get()
        shell: dict[str, str] = {}
        if fault.startswith("env_in_driver_only:"):
            # Test switch: the variable is set in this process's environment only (as in the shell
            # that started a driver), not in the runtime_env; it is taken out again once the hosts
            # exist, since this process (a reused Tune actor) runs the next trial too.
            name = fault.partition(":")[2]
            if name in delivered:
                shell[name] = delivered.pop(name)
        saved = {name: os.environ.get(name) for name in shell}
        os.environ.update(shell)
        log_dir = Path(tempfile.gettempdir()) / "spectune-engines" / self.sweep_name / self.session_id
        try:
            return EngineGroup(
                self.engine_config, placement=self.placement, placement_group=pg, log_dir=str(log_dir),
                start_timeout_s=self.start_timeout_s, label=self.label, runtime_env_vars=delivered,
            )
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value

    def _on_time_limit(self) -> None:
        self._timed_out.set()
        logger.warning("%s (%s): past its time limit; killing its engine host(s)", self.label, self.session_id)
        assert self.group is not None
        self.group.kill()

    def _read_log(self) -> str:
        """The engine log from its host, or, where the host is gone (killed at the time limit),
        from the file where it was written."""
        try:
            assert self.group is not None
            return self.group.log_text()
        except Exception:  # noqa: BLE001 - the host is gone: read the log where it was written
            log_path = self.info.get("log_path")
            if log_path and Path(log_path).exists():
                return Path(log_path).read_text(encoding="utf-8", errors="replace")[-4_000_000:]
            return ""


ENGINE_EXIT_SETTLE_S = 15.0
"""How long an engine that is alive but does not answer may take to exit or answer before a failed
step is blamed on the step (a dying engine closes its port before its exit is visible)."""


def launch_failure_reason(cause: BaseException) -> str:
    """The trial's (or visit's) reason for an engine that never served, from the error
    ``EngineHost.start`` raised: ``not_healthy`` where it was not healthy by its start deadline
    (``EngineStartTimeout``, ``EngineNotReady``), else ``launch_failed``. ``timeout`` is kept for the
    trial's own time limit (``results.FAILURE_REASONS``)."""
    return "not_healthy" if getattr(cause, "reason", None) in ("not_healthy", "timeout") else "launch_failed"


def step_failure(session: EngineSession, reason: str, exc: BaseException, *,
                 settle_s: float = ENGINE_EXIT_SETTLE_S) -> TrialFailure:
    """The failure of a step that talked to the engine (probe, benchmark): ``engine_died`` where an
    engine process is gone (naming the node it died on first, across nodes), else ``reason``."""
    gone = _gone_node(session, settle_s=settle_s)
    if gone is None:
        return TrialFailure(reason, str(exc))
    if session.group is not None and session.group.nnodes > 1:
        return TrialFailure("engine_died", f"the engine died on {node_words(gone)} first ({gone.get('detail')}); "
                            f"every node's part was stopped. The step saw: {exc}")
    return TrialFailure("engine_died", str(exc))


def _gone_node(session: EngineSession, *, settle_s: float) -> dict[str, Any] | None:
    """The node whose engine is gone (first), or None while every node's engine is alive; an engine
    alive but not answering is given ``settle_s`` to answer or exit."""
    group = session.group
    if group is None:
        return None
    found: list[dict[str, Any]] = []

    def settled() -> bool:
        health = group.health()
        gone = group.first_gone(health)
        if gone is not None:
            found.append(gone)
            return True
        return all(h.get("healthy") for h in health)

    try:
        wait_until(settled, timeout_s=settle_s, what="the engine to answer or exit", poll_s=0.5)
    except TimeoutError:
        pass  # alive and not answering: the step's own failure stands
    return found[0] if found else None
