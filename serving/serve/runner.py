"""``spectune serve`` in the foreground: the application, one readiness line, a clean stop.

Ready means the application is RUNNING (every replica's engine healthy and audited) and the
endpoint answers through the ingress. On Ctrl-C or SIGTERM the application is deleted, a Serve
and Ray started here are shut down, and anything of that Ray still alive is stopped.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import ray
from ray import serve

from serving.engine.config import EngineConfig
from serving.local_http import open_direct
from serving.serve.app import build_app
from serving.serve.cluster import ClusterSession, check_serve_address, own_processes, start_or_join, stop_leftovers
from serving.serve.ingress import key_digest
from serving.serve.options import ServeOptions, ServeStartError
from serving.serve.serve_preflight import (
    ServePreflightError,
    check_engine_here,
    check_engine_on_cluster,
    check_network,
    check_resources,
)
from serving.serve.provenance import Provenance
from serving.waiting import wait_until

__all__ = ["REFERENCE_TEXT_NOTE", "Readiness", "ServePreflightError", "ServeStartError", "base_url", "run_foreground"]

logger = logging.getLogger(__name__)

READY_TIMEOUT_S = 120.0
"""How long the endpoint may take to answer through the ingress once the application is RUNNING
(HAProxy picks up new replicas on its next reload)."""


REFERENCE_TEXT_NOTE = "note: the reference engine's weights are random, so its text is gibberish by design (its speed is real)"
"""Said under the readiness line when the engine is the reference engine."""

_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Failed|Died|Timeout|NotReady)\b.*:")

@dataclass(frozen=True)
class Readiness:
    """What the readiness line says.

    Attributes:
        url: Base URL of the OpenAI-compatible endpoint (``.../v1`` is the client's base_url).
        model: The model id clients send.
        audit: ``GET /spectune/audit`` of the replica that answered.
        replicas: How many replicas, in words.
        ingress: The ingress path (``haproxy`` or ``proxy``; a joined cluster's is read from it).
        api_key_required: Whether clients must send the key.
        info: ``GET /spectune/info`` of the replica that answered (the run it came from).
        engine_kind: ``EngineConfig.kind`` of what is served (``reference`` gets :meth:`note`).
    """

    url: str
    model: str
    audit: dict[str, Any]
    replicas: str
    ingress: str
    api_key_required: bool
    info: dict[str, Any] | None = None
    engine_kind: str = "sglang"

    def note(self) -> str | None:
        """What to say under the line, if anything: the reference engine's text is gibberish by design."""
        return REFERENCE_TEXT_NOTE if self.engine_kind == "reference" else None

    def line(self) -> str:
        """One line: URL, model, audit verdict, and the sweep, trial and MLflow run it came from (if known)."""
        report = self.audit.get("startup", {})
        processes = report.get("processes", [])
        workers = sum(1 for p in processes if p.get("role") == "tp_worker")
        names = ", ".join(sorted({*report.get("expected", {}), *report.get("worker_expected", {})})) or "nothing expected"
        verdict = (f"env audit passed ({len(processes)} processes, {workers} TP workers carry {names})"
                   if self.audit.get("ok") else "env audit FAILED")
        key = "API key required" if self.api_key_required else "no API key"
        origin = ("; " + Provenance.model_validate(self.info["provenance"]).ready_text()
                  if self.info and self.info.get("provenance") else "")
        return (f"serving {self.model} at {self.url}/v1 ({self.replicas}, {self.ingress} ingress, {key}); {verdict}; "
                f"audit: {self.url}/spectune/audit{origin}")


def base_url(options: ServeOptions) -> str:
    """The URL clients use (a wildcard bind is reached through the loopback)."""
    host = "127.0.0.1" if options.host in ("0.0.0.0", "") else "::1" if options.host == "::" else options.host
    host = f"[{host}]" if ":" in host else host
    prefix = "" if options.route_prefix == "/" else options.route_prefix
    return f"http://{host}:{options.port}{prefix}"


def _get(url: str, *, key: str | None, timeout_s: float = 10.0) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with open_direct(request, timeout_s=timeout_s) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()


def _deployment_messages(name: str) -> str:
    """Why the application's deployments are not running, as Serve recorded it (e.g. a failed env audit)."""
    app = serve.status().applications.get(name)
    if app is None:
        return ""
    return "\n".join(f"{deployment}: {_without_traceback(status.message)}"
                     for deployment, status in app.deployments.items() if status.message)


def _without_traceback(message: str) -> str:
    """Serve's message with the replica's traceback cut to its first line and the exception that ended it."""
    lines = message.splitlines()
    last_traceback = max((i for i, line in enumerate(lines) if "Traceback (most recent call last)" in line), default=-1)
    if last_traceback < 0:
        return message
    raised = next((i for i in range(len(lines) - 1, last_traceback, -1)
                   if _EXCEPTION_LINE.match(lines[i])), None)
    return "\n".join([lines[0], *lines[raised:]]) if raised is not None else message


def _application_status(name: str) -> tuple[str, str]:
    app = serve.status().applications.get(name)
    return (str(getattr(app.status, "value", app.status)), app.message or "") if app is not None else ("MISSING", "")


def _report_status_changes(name: str, *, every_s: float) -> None:
    """Until interrupted: log each change of the application's status."""
    last = ("RUNNING", "")
    ticker = threading.Event()  # never set: its wait() is a sleep that Ctrl-C interrupts
    while not ticker.wait(every_s):
        now = _application_status(name)
        if now != last:
            level = logging.INFO if now[0] == "RUNNING" else logging.WARNING
            logger.log(level, "application %r is %s%s", name, now[0], f": {now[1]}" if now[1] else "")
            last = now


@contextlib.contextmanager
def _on_stop_signals(handler: Callable[[int, object], None]) -> Iterator[None]:
    """``handler`` for SIGINT and SIGTERM while the block runs (main thread only), the previous ones after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _signals_stop() -> contextlib.AbstractContextManager[None]:
    """While serving, Ctrl-C and SIGTERM stop it (KeyboardInterrupt); restored afterwards.

    SIGINT gets the handler explicitly: a background job of a non-interactive shell inherits it ignored.
    """

    def interrupt(signum: int, frame: object) -> None:
        # from the first signal on, another one only says to wait
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, _still_stopping)
        raise KeyboardInterrupt

    return _on_stop_signals(interrupt)


def _still_stopping(signum: int, frame: object) -> None:
    logger.warning("still stopping; please wait")


def _uninterruptible(what: str) -> contextlib.AbstractContextManager[None]:
    """A teardown that a second Ctrl-C must not cut short (it would leave engines behind)."""

    def ignore(signum: int, frame: object) -> None:
        logger.warning("still %s; please wait", what)

    return _on_stop_signals(ignore)


def _wait_ready(options: ServeOptions, *, api_key: str | None, ingress: str, engine_kind: str) -> Readiness:
    url = base_url(options)
    try:
        wait_until(lambda: _get(url + "/health", key=None)[0] == 200, timeout_s=READY_TIMEOUT_S,
                   what=f"{url}/health to answer 200 through the ingress", poll_s=0.25)
    except TimeoutError as exc:
        raise ServeStartError(f"the application is running but {exc}") from None
    status, body = _get(url + "/v1/models", key=api_key)
    models = json.loads(body).get("data", []) if status == 200 else []
    status, body = _get(url + "/spectune/audit", key=api_key, timeout_s=30)
    audit = json.loads(body) if status == 200 else {"ok": False, "error": body.decode(errors="replace")[:300]}
    status, body = _get(url + "/spectune/info", key=api_key)
    info = json.loads(body) if status == 200 else None
    return Readiness(
        url=url, model=models[0]["id"] if models else "?", audit=audit, replicas=options.replicas_text(),
        ingress=ingress, api_key_required=api_key is not None, info=info, engine_kind=engine_kind,
    )


def run_foreground(
    config: EngineConfig,
    options: ServeOptions,
    *,
    api_key: str | None,
    address: str | None,
    on_ready: Callable[[Readiness], None],
    status_every_s: float = 5.0,
    provenance: Provenance | None = None,
    wait_for_resources_s: float = 0.0,
) -> None:
    """Serve ``config`` until Ctrl-C / SIGTERM, then stop everything this call started.

    The preflight (``serving.serve.serve_preflight``) runs before anything is deployed.

    Args:
        config: The engine configuration (a sweep's best.yaml).
        options: How to serve it.
        api_key: Clients must send it (``Authorization: Bearer``); replicas get only its SHA-256.
        address: A running Ray cluster to join; None starts a local one.
        on_ready: Called once with the readiness facts (the CLI prints the line).
        status_every_s: How often the application's status is checked (changes are logged).
        provenance: Where ``config`` came from (``GET /spectune/info``, the readiness line).
        wait_for_resources_s: How long the preflight waits for nodes that can hold the replicas; 0
            refuses at once.

    Raises:
        ServePreflightError: the engine cannot start here, or the cluster cannot hold the replicas.
        ServeStartError: the application failed to deploy or never answered.
    """
    with _signals_stop():
        notes = check_engine_here(config) if address is None else []
        cluster = start_or_join(options, address=address)
        # ray.init replaced our SIGTERM handler with its own: ours again
        with _signals_stop():
            _serve_started_cluster(config, options, cluster=cluster, api_key=api_key, address=address,
                                   on_ready=on_ready, status_every_s=status_every_s, provenance=provenance,
                                   wait_for_resources_s=wait_for_resources_s, notes=notes)


def _serve_started_cluster(config: EngineConfig, options: ServeOptions, *, cluster: ClusterSession,
                           api_key: str | None, address: str | None, on_ready: Callable[[Readiness], None],
                           status_every_s: float, provenance: Provenance | None, wait_for_resources_s: float,
                           notes: list[str]) -> None:
    """``run_foreground`` once connected to Ray: preflight, deploy, serve, and always tear down."""
    serve_started = deployed = False
    try:
        notes.append(check_resources(config, options, wait_s=wait_for_resources_s, say=logger.warning))
        network_note = check_network(config, options)
        if network_note:
            notes.append(network_note)
        if address is not None:
            notes += check_engine_on_cluster(config, options, wait_s=wait_for_resources_s, say=logger.warning)
        for note in notes:
            logger.info("preflight: %s", note)
        serve_started = True
        serve.start(http_options={"host": options.host, "port": options.port}, proxy_location="EveryNode")
        check_serve_address(options)
        app = build_app(config, options, api_key_sha256=key_digest(api_key) if api_key else None,
                        provenance=provenance)
        logger.info("deploying %s (%s) as application %r", config.model_path, options.replicas_text(), options.app_name)
        deployed = True
        try:
            serve.run(app, name=options.app_name, route_prefix=options.route_prefix, blocking=False)
        except RuntimeError as exc:
            raise ServeStartError(
                f"application {options.app_name!r} failed to deploy: {exc}\n{_deployment_messages(options.app_name)}"
            ) from None
        on_ready(_wait_ready(options, api_key=api_key, ingress=cluster.ingress, engine_kind=config.kind))
        _report_status_changes(options.app_name, every_s=status_every_s)
    except KeyboardInterrupt:
        logger.info("stopping")
    finally:
        with _uninterruptible("stopping the application and its engines"):
            _teardown(options, deployed=deployed, serve_started=serve_started, cluster=cluster)


def _teardown(options: ServeOptions, *, deployed: bool, serve_started: bool, cluster: ClusterSession) -> None:
    """Delete the application (each replica stops its engine), then a Serve and Ray started here,
    then whatever of that Ray outlived its shutdown; each step runs even if the one before failed."""
    began = time.monotonic()
    try:
        if deployed:
            try:
                serve.delete(options.app_name)
            except Exception as exc:  # noqa: BLE001 - Serve's shutdown (and Ray's) must run regardless
                logger.warning("application %r was not deleted cleanly (%s: %s); shutting down regardless%s",
                               options.app_name, type(exc).__name__, exc,
                               "" if cluster.started_here else
                               f"; on the joined cluster check it with serve status, remove it with "
                               f"serve shutdown or a redeploy")
        if serve_started and cluster.started_here:
            serve.shutdown()
    finally:
        ours = own_processes() if cluster.started_here else []
        ray.shutdown()  # a cluster started here stops; a joined one only loses this driver
        if cluster.started_here:
            stop_leftovers(ours)
    logger.info("stopped in %.1f s", time.monotonic() - began)
