"""A node of rank >= 1 (``--node-rank`` R > 0 of ``--nnodes`` N): its TP ranks and a health server.

Mirrors SGLang 0.5.23's ``Engine._launch_subprocesses`` for such a node, with
``launch_dummy_health_check_server``; see docs/reference-engine.md ("Across nodes").

Exit status: 0 after rank 0's shutdown broadcast or a SIGTERM/SIGINT; 1 when a rank failed or
died, when the ranks never became ready, or when the health port is taken.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from typing import Optional

from aiohttp import web

from serving.reference.faults import Faults
from serving.reference.launcher import RankExit, WorkerGroup, WorkerStartError
from serving.reference.server import SHUTDOWN_TIMEOUT_S, WORKER_READY_TIMEOUT_S, prepare_environment
from serving.reference.server_args import ServerArgs

__all__ = ["SIGTERM_GRACE_S", "build_health_app", "serve_follower"]

logger = logging.getLogger(__name__)

SIGTERM_GRACE_S = 5.0
"""How long a signalled node waits for rank 0's shutdown broadcast before stopping its ranks itself."""


def build_health_app(*, enable_metrics: bool) -> web.Application:
    """SGLang's ``launch_dummy_health_check_server``: 200 on the health routes, an empty ``/metrics``."""

    async def ok(request: web.Request) -> web.Response:
        return web.Response(status=200)

    app = web.Application()
    for path in ("/ping", "/health", "/health_generate"):
        app.router.add_get(path, ok)
    if enable_metrics:

        async def metrics(request: web.Request) -> web.Response:
            return web.Response(body=b"", headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

        app.router.add_get("/metrics", metrics)
    return app


async def serve_follower(args: ServerArgs, *, faults: Faults) -> int:
    """Run node ``args.node_rank`` (>= 1) until its ranks exit or a signal; the exit status."""
    assert args.node_rank >= 1, "node rank 0 runs serving.reference.server.serve"
    loop = asyncio.get_running_loop()
    node = args.node_rank
    signalled = asyncio.Event()
    ready = False

    def on_signal(sig: signal.Signals) -> None:
        if signalled.is_set():
            return
        if ready:
            # SGLang's line (srt/entrypoints/engine.py).
            logger.warning(
                "%s received on node_rank %d; waiting for the rank-0 ShutdownReq broadcast to stop the schedulers.",
                sig.name, node,
            )
        else:
            logger.info("%s received on node_rank %d before its ranks were ready; stopping them", sig.name, node)
        signalled.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    if faults.die_after_tokens is not None:
        logger.warning("fault die_after_tokens counts the tokens node 0's HTTP server receives; off on node_rank %d", node)

    workers = WorkerGroup.with_faults(args=args, faults=faults)
    health: Optional[web.AppRunner] = None
    exit_code = 0
    stop_grace_s = SIGTERM_GRACE_S  # for ranks still running once one has exited
    # The health port is bound now and listened on once the ranks are ready (refused until then, as
    # SGLang's node is): starting the ranks opens sockets on ephemeral ports (gloo, the rendezvous), and
    # one of them could otherwise take the port the launcher picked for this node.
    try:
        port_socket = _bind(args.host, args.port)
    except OSError as exc:
        logger.error("node_rank %d: cannot listen on %s:%d: %s", node, args.host, args.port, exc)
        return 1
    try:
        prepare_environment(args)
        workers.start()
        if faults.hang_on_start:
            logger.warning("fault hang_on_start: node_rank %d never serves its health server", node)
            await signalled.wait()
            stop_grace_s = 0.0
            return exit_code
        wait_task = loop.run_in_executor(None, lambda: workers.wait_ready(timeout_s=WORKER_READY_TIMEOUT_S))
        signal_task = asyncio.ensure_future(signalled.wait())
        done, _ = await asyncio.wait({wait_task, signal_task}, return_when=asyncio.FIRST_COMPLETED)
        if wait_task not in done:
            stop_grace_s = 0.0
            return exit_code
        try:
            wait_task.result()
        except WorkerStartError as exc:
            logger.error("node_rank %d: TP workers failed to start: %s", node, exc)
            exit_code = 1
            return exit_code
        health = web.AppRunner(build_health_app(enable_metrics=args.enable_metrics), access_log=None,
                               shutdown_timeout=SHUTDOWN_TIMEOUT_S)
        await health.setup()
        try:
            await web.SockSite(health, port_socket).start()
        except OSError as exc:
            logger.error("node_rank %d: cannot listen on %s:%d: %s", node, args.host, args.port, exc)
            exit_code = 1
            return exit_code
        ready = True
        logger.info("Dummy health check server started in background thread at %s:%d", args.host, args.port)
        logger.info(
            "node_rank %d of %d ready: TP ranks %s (%s); this node serves /ping, /health and /health_generate "
            "only, the API is node 0's", node, args.nnodes, list(workers.ranks),
            ", ".join(f"{w['process_name']}={w['pid']}" for w in workers.worker_info()),
        )
        exit_task = loop.run_in_executor(None, workers.wait_first_exit)
        await asyncio.wait({exit_task, signal_task}, return_when=asyncio.FIRST_COMPLETED)
        if not exit_task.done():
            # Signalled: rank 0's broadcast ends the ranks if node 0 is stopping too; else give up.
            await asyncio.wait({exit_task}, timeout=SIGTERM_GRACE_S)
            if not exit_task.done():
                logger.warning(
                    "node_rank %d: no shutdown broadcast from rank 0 within %.0f s; stopping TP ranks %s anyway "
                    "(node 0's ranks will fail their next collective)", node, SIGTERM_GRACE_S, list(workers.ranks),
                )
                stop_grace_s = 0.0
                return exit_code
        exit_code = _outcome(node, exit_task.result(), signalled=signalled.is_set())
        return exit_code
    finally:
        signalled.set()  # a signal from here on changes nothing
        if health is not None:
            await health.cleanup()
        port_socket.close()
        await loop.run_in_executor(None, lambda: workers.stop(grace_s=stop_grace_s))
        logger.info("node_rank %d stopped (exit status %d)", node, exit_code)


def _bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` and not yet listening (connections are refused until the
    health server listens on it); raises OSError where the port is taken. No SO_REUSEADDR: on Linux two
    sockets that both set it may share a port nobody listens on yet, and the hold must be exclusive."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind((host, port))
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def _outcome(node: int, first: RankExit, *, signalled: bool) -> int:
    """Log why this node's ranks ended; the node's exit status."""
    if first.clean:
        logger.info("node_rank %d: %s after rank 0's shutdown broadcast; this node exits", node, first.describe())
        return 0
    logger.error(
        "node_rank %d: %s: a collective with a rank that is gone failed (node 0 or another node stopped hard)%s; "
        "this node cannot continue and exits 1", node, first.describe(), " while stopping" if signalled else "",
    )
    return 1
