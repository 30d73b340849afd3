"""The Ray cluster ``spectune serve`` runs on: start a local one with the right ingress, or join one.

A local Ray started here gets ``RAY_SERVE_ENABLE_HA_PROXY`` from ``ServeOptions.ingress`` before it
starts, and free ports for what HAProxy mode takes at fixed numbers. A joined cluster keeps the
ingress it was started with, read from a task running on it.
"""

from __future__ import annotations

import logging
import os
import signal
from dataclasses import dataclass

import psutil

from serving.ports import free_port
from serving.ray_auth import choose_local_auth_mode
from serving.serve.options import IngressPath, ServeOptions, ServeStartError
from serving.waiting import wait_until

__all__ = [
    "HAPROXY_FIXED_PORTS",
    "ClusterSession",
    "ServeAddressTaken",
    "check_serve_address",
    "own_processes",
    "start_or_join",
    "stop_leftovers",
]

logger = logging.getLogger(__name__)

HAPROXY_FIXED_PORTS = (
    "RAY_SERVE_HAPROXY_STATS_PORT",  # 8404, bound on every interface
    "RAY_SERVE_HAPROXY_METRICS_PORT",  # 9101, bound on every interface
    "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT",  # 8500: the proxy HAProxy falls back to while no replica is up
    "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT",  # 9500
)
"""Variables naming ports that Serve's HAProxy mode takes at fixed numbers unless told otherwise."""

LEFTOVER_EXIT_S = 10.0
"""How long the processes of a Ray started here may take to exit on their own after ``ray.shutdown``
(Ray's workers notice their raylet is gone within a few seconds)."""
LEFTOVER_KILL_S = 5.0
"""How long a leftover may take to exit after SIGTERM before it is SIGKILLed."""


class ServeAddressTaken(ServeStartError):
    """The joined cluster runs Serve already, on another host or port than asked for."""


@dataclass(frozen=True)
class ClusterSession:
    """The cluster this process is connected to.

    Attributes:
        started_here: This process started it (and shuts it down at the end).
        ingress: Its ingress path.
    """

    started_here: bool
    ingress: IngressPath


def start_or_join(options: ServeOptions, *, address: str | None) -> ClusterSession:
    """Join ``address``, or start a local Ray with the ingress switch of ``options`` set first."""
    import ray

    if address is not None:
        ray.init(address=address, log_to_driver=False)
        ingress = _cluster_ingress()
        logger.info("joined the Ray cluster at %s; its ingress path: %s (set when its nodes started)", address, ingress)
        _warn_if_unreachable_replicas(options, ingress=ingress)
        return ClusterSession(started_here=False, ingress=ingress)
    haproxy = options.ingress == "haproxy"
    os.environ["RAY_SERVE_ENABLE_HA_PROXY"] = "1" if haproxy else "0"  # inherited by the Ray processes
    if haproxy:
        for name in HAPROXY_FIXED_PORTS:
            if not os.environ.get(name):
                os.environ[name] = str(free_port())
        # not more HAProxy threads (default 4) than cores
        os.environ.setdefault("RAY_SERVE_HAPROXY_NBTHREAD", str(max(1, min(4, os.cpu_count() or 1))))
    choose_local_auth_mode()
    ray.init(address="local", include_dashboard=False, log_to_driver=False)
    logger.info("started a local Ray (%s ingress)", options.ingress)
    return ClusterSession(started_here=True, ingress=options.ingress)


def _cluster_ingress() -> IngressPath:
    import ray

    @ray.remote(num_cpus=0)
    def switch() -> str | None:
        return os.environ.get("RAY_SERVE_ENABLE_HA_PROXY")

    return "haproxy" if ray.get(switch.remote(), timeout=120) == "1" else "proxy"


def _warn_if_unreachable_replicas(options: ServeOptions, *, ingress: str) -> None:
    """Behind HAProxy each replica serves HTTP itself, on the address Serve binds (``host``): on the
    loopback, HAProxy on one node cannot reach the replicas on another."""
    import ray

    nodes = sum(1 for node in ray.nodes() if node.get("Alive"))
    if ingress == "haproxy" and nodes > 1 and options.host in ("127.0.0.1", "localhost", "::1"):
        logger.warning(
            "host=%s on a %d-node cluster with HAProxy ingress: replicas listen on the loopback, so only the "
            "replicas on the node a request arrives at can answer it; pass --host 0.0.0.0 (with --api-key) to "
            "use every node's replicas", options.host, nodes,
        )


def check_serve_address(options: ServeOptions) -> None:
    """After ``serve.start``: a joined cluster may run Serve already, on its own host and port
    (``serve.start`` then keeps them); say so rather than announce a URL nobody listens on.

    Raises:
        ServeAddressTaken: the running Serve listens elsewhere.
    """
    try:  # the running Serve's HTTP options: Ray has no public call for them (2.60)
        from ray.serve.context import _get_global_client
    except ImportError:
        logger.info("this Ray cannot tell where a running Serve listens; assuming %s:%s", options.host, options.port)
        return
    running = _get_global_client().http_config
    if (running.host, running.port) != (options.host, options.port):
        raise ServeAddressTaken(
            f"Serve already runs on this cluster at {running.host}:{running.port}, not {options.host}:{options.port}; "
            f"pass --host {running.host} --port {running.port} (and an --app-name and --route-prefix of its own)"
        )


def own_processes() -> list[psutil.Process]:
    """Every live descendant of this process (with a Ray started here, all of it, engines included);
    take it before Ray shuts down, while none has been re-parented."""
    try:
        return psutil.Process().children(recursive=True)
    except psutil.Error:
        return []


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def stop_leftovers(processes: list[psutil.Process], *, exit_s: float = LEFTOVER_EXIT_S,
                   kill_s: float = LEFTOVER_KILL_S) -> list[str]:
    """After ``ray.shutdown`` of a Ray started here: give ``processes`` ``exit_s`` to exit, then
    SIGTERM the survivors, SIGKILL them after ``kill_s``; returns a description of each stopped."""
    def survivors() -> list[psutil.Process]:
        return [proc for proc in processes if _running(proc)]

    try:
        wait_until(lambda: not survivors(), timeout_s=exit_s, what="Ray's processes to exit", poll_s=0.2)
        return []
    except TimeoutError:
        pass
    stopped = []
    for proc in survivors():
        try:
            stopped.append(f"{proc.pid} ({' '.join(proc.cmdline())[:120]})")
            proc.send_signal(signal.SIGTERM)
        except psutil.Error:
            continue
    try:
        wait_until(lambda: not survivors(), timeout_s=kill_s, what="leftover processes to exit on SIGTERM", poll_s=0.2)
    except TimeoutError:
        for proc in survivors():
            try:
                proc.kill()
            except psutil.Error:
                continue
    if stopped:
        logger.warning("stopped %d process(es) that outlived Ray's shutdown: %s", len(stopped), "; ".join(stopped))
    return stopped
