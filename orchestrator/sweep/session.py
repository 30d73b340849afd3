"""EngineSession: one engine's life inside a trial's placement group, from host actor to shipped log.

A trial and a confirmation visit both need the same thing: a fresh engine of one configuration,
started by an EngineHost actor pinned to the bundle that holds the engine's GPUs (bundle 1; bundle
0 when the engine takes none), audited, used, then stopped with proof that nothing is left. This
module is that lifecycle, written once; ``orchestrator.sweep.trial`` says what is done with the
engine in between.

It follows ``serving.engine.process.EngineProcess``: ``open()`` / ``close()``, and a context
manager on top whose ``__enter__`` closes again when opening fails. The trial calls ``open()`` and
``close()`` itself, because its failure handling (which tells the waiting trials at once that
the correctness baseline failed) must run before a teardown that can take minutes.

Every way the engine can fail to come up is a :class:`TrialFailure` with a reason tag; a teardown
that left something behind is kept (``teardown_problem``), for the caller to record or log.
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
from serving.engine.host import create_engine_host
from serving.environ import ENV
from serving.waiting import wait_until

__all__ = ["EngineSession", "TrialFailure"]

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
    """One EngineHost actor and its engine: create, start, audit; stop, prove, ship the log.

    After ``open()``: ``host`` (the actor handle), ``info`` (what ``EngineHost.start`` reported:
    url, pid, log path, node, ``audit``), ``url``, ``audit`` and ``audit_ok``.
    After ``close()``: ``stop_error`` and ``teardown_problem``.
    """

    def __init__(
        self,
        engine_config: EngineConfig,
        *,
        session_id: str,
        label: str,
        sweep_name: str,
        num_gpus: int,
        start_timeout_s: float,
        launch_reason: Callable[[BaseException], str],
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
            num_gpus: GPUs of the engine's bundle (0: the engine shares bundle 0 with the caller).
            start_timeout_s: How long the engine may take to become healthy.
            launch_reason: The failure's reason tag for an engine that never served, from the
                exception ``EngineHost.start`` raised (unwrapped from Ray's wrapper).
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
        self.num_gpus = num_gpus
        self.start_timeout_s = start_timeout_s
        self.launch_reason = launch_reason
        self.time_limit_s = time_limit_s
        self.timings = {} if timings is None else timings
        self.ship_log = ship_log
        self.host: Any = None
        self.info: dict[str, Any] = {}
        self.stop_error: BaseException | None = None
        self._timed_out = threading.Event()
        self._timer: threading.Timer | None = None
        self._closed = False

    # --- what the steps read -----------------------------------------------------------------

    @property
    def url(self) -> str:
        """Base URL of the running engine."""
        return self.info["url"]

    @property
    def audit(self) -> dict[str, Any]:
        """The env audit of the engine's process tree (``AuditReport.to_dict()``)."""
        return self.info["audit"]

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
        """Create the host actor in this task's placement group, start the time limit, start the
        engine (the host waits until it is healthy and audits its process tree).

        Raises:
            TrialFailure: the engine never served (``timeout`` once the time limit passed, else
                ``launch_reason`` of the error). Call ``close()`` either way.
        """
        self.host = self._create_host()
        if self.time_limit_s is not None:
            self._timer = threading.Timer(self.time_limit_s, self._on_time_limit)
            self._timer.daemon = True
            self._timer.start()
        tic = time.monotonic()
        try:
            self.info = ray.get(self.host.start.remote())
        except Exception as exc:  # noqa: BLE001 - every launch failure is a recorded result
            cause = _cause(exc)
            reason = "timeout" if self.timed_out else self.launch_reason(cause)
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
        if self.host is None:
            return
        tic = time.monotonic()
        log_text = ""
        try:
            try:
                self.info["stop"] = ray.get(self.host.stop.remote(), timeout=180)
            except Exception as exc:  # noqa: BLE001 - kept for the caller: the trial records it, a visit logs it
                self.stop_error = exc
            if self.ship_log is not None:
                log_text = self._read_log()
        finally:
            ray.kill(self.host, no_restart=True)
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

    def _create_host(self) -> Any:
        """The EngineHost actor in this task's placement group: bundle 1 holds the engine's GPUs."""
        pg = ray.util.get_current_placement_group()
        bundle = 1 if self.num_gpus > 0 else 0
        delivered = dict(self.engine_config.env)
        fault = ENV.SPECTUNE_SWEEP_FAULT.get()
        if fault.startswith("env_in_driver_only:"):
            # Test switch: the bug this product exists to catch. The variable is put in this
            # process's environment only ("the driver's shell") and left out of the runtime_env.
            name = fault.partition(":")[2]
            if name in delivered:
                os.environ[name] = delivered.pop(name)
        log_dir = Path(tempfile.gettempdir()) / "spectune-engines" / self.sweep_name / self.session_id
        return create_engine_host(
            self.engine_config, log_dir=str(log_dir), num_gpus=self.num_gpus, placement_group=pg,
            bundle_index=bundle, start_timeout_s=self.start_timeout_s, label=self.label, runtime_env_vars=delivered,
        )

    def _on_time_limit(self) -> None:
        self._timed_out.set()
        logger.warning("%s (%s): past its time limit; killing its engine host", self.label, self.session_id)
        ray.kill(self.host, no_restart=True)

    def _read_log(self) -> str:
        """The engine log from its host, or, where the host is gone (killed at the time limit),
        from the file where it was written."""
        try:
            return ray.get(self.host.log_text.remote(), timeout=60)
        except Exception:  # noqa: BLE001 - the host is gone: read the log where it was written
            log_path = self.info.get("log_path")
            if log_path and Path(log_path).exists():
                return Path(log_path).read_text(encoding="utf-8", errors="replace")[-4_000_000:]
            return ""


ENGINE_EXIT_SETTLE_S = 15.0
"""How long an engine that is alive but does not answer is given to exit or answer again before a
failed step is blamed on the step: a dying engine closes its port before its exit is visible."""


def engine_gone_or(host: Any, reason: str, *, settle_s: float = ENGINE_EXIT_SETTLE_S) -> str:
    """``engine_died`` if the engine process of ``host`` is gone (or the host with it), else ``reason``.

    An engine that is still alive but does not answer its health check is watched for up to
    ``settle_s``: under load, the reference engine's ``die_after_tokens`` fault was seen alive for
    a moment after its port had closed, and the trial was recorded ``bench_failed`` for an engine
    that died."""
    verdict: list[str] = []

    def settled() -> bool:
        try:
            health = ray.get(host.health.remote(), timeout=30)
        except Exception:  # noqa: BLE001 - a host that cannot answer has lost its engine too
            verdict.append("engine_died")
            return True
        if not health.get("alive"):
            verdict.append("engine_died")
            return True
        return bool(health.get("healthy"))

    try:
        wait_until(settled, timeout_s=settle_s, what="the engine to answer or exit", poll_s=0.5)
    except TimeoutError:
        pass  # alive and not answering: the step's own failure stands
    return verdict[0] if verdict else reason
