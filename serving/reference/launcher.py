"""Starting and stopping the TP worker processes (multiprocessing *spawn*, one per rank).

The workers' environment is whatever ``os.environ`` holds at ``start()``: that is the whole
env-propagation story, as with SGLang's scheduler processes. The ``late_env`` fault switch
reproduces the classic bug of setting variables too late: they are popped before the spawn and
put back afterwards, so this process has them and the workers do not.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import time
from multiprocessing.connection import Connection, wait
from typing import Optional, Sequence

from serving.ports import free_port
from serving.reference.faults import EnvCondition
from serving.reference.protocol import Shutdown, WorkerFailed, WorkerReady
from serving.reference.server_args import ServerArgs
from serving.reference.tp_worker import WorkerConfig, run_worker

__all__ = ["WorkerGroup", "WorkerStartError"]

logger = logging.getLogger(__name__)


class WorkerStartError(RuntimeError):
    """A worker died or reported a failure before it was ready."""


class WorkerGroup:
    """The ``tp_size`` worker processes of one server.

    Args:
        args: Resolved server arguments.
        hide_env: Variable names to keep out of the workers' environment (``late_env`` fault).
        corrupt_allreduce_when: The ``corrupt_allreduce_when`` fault's condition; each worker
            checks it against its own environment.
    """

    def __init__(
        self, *, args: ServerArgs, hide_env: Sequence[str] = (), corrupt_allreduce_when: Optional[EnvCondition] = None
    ) -> None:
        self.args = args
        self.hide_env = tuple(hide_env)
        self.corrupt_allreduce_when = corrupt_allreduce_when
        self.processes: list[multiprocessing.process.BaseProcess] = []
        self.conns: list[Connection] = []
        self.ready: list[WorkerReady] = []

    def start(self) -> None:
        """Spawn one process per rank (returns at once; see ``wait_ready``)."""
        args = self.args
        ctx = multiprocessing.get_context("spawn")
        addr = args.dist_init_addr or f"127.0.0.1:{free_port()}"
        hidden = {name: os.environ.pop(name) for name in self.hide_env if name in os.environ}
        if hidden:
            logger.warning(
                "fault late_env: spawning workers without %s (restored in this process afterwards)",
                ", ".join(sorted(hidden)),
            )
        try:
            for rank in range(args.tp_size):
                cfg = WorkerConfig(
                    args=args,
                    rank=rank,
                    init_method=f"tcp://{addr}",
                    parent_pid=os.getpid(),
                    corrupt_allreduce_when=self.corrupt_allreduce_when,
                )
                parent_conn, child_conn = ctx.Pipe(duplex=True)
                proc = ctx.Process(target=run_worker, args=(cfg, child_conn), name=cfg.process_name, daemon=True)
                proc.start()
                child_conn.close()
                self.processes.append(proc)
                self.conns.append(parent_conn)
                logger.info("spawned %s (pid %d)", cfg.process_name, proc.pid)
        finally:
            os.environ.update(hidden)

    def wait_ready(self, *, timeout_s: float) -> list[WorkerReady]:
        """Block until every rank reported ready.

        Raises:
            WorkerStartError: a rank failed or exited first, or the timeout passed.
        """
        deadline = time.monotonic() + timeout_s
        pending = dict(enumerate(self.conns))
        ready: dict[int, WorkerReady] = {}
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WorkerStartError(f"TP workers {sorted(pending)} not ready after {timeout_s:.0f}s")
            sentinels = {self.processes[r].sentinel: r for r in pending}
            for obj in wait(list(pending.values()) + list(sentinels), timeout=min(left, 1.0)):
                if obj in sentinels:
                    rank = sentinels[obj]
                    if rank in pending and not pending[rank].poll():
                        code = self.processes[rank].exitcode
                        raise WorkerStartError(f"TP worker rank {rank} exited with code {code} before it was ready")
                    continue
                rank = next(r for r, c in pending.items() if c is obj)
                try:
                    msg = obj.recv()
                except EOFError:
                    raise WorkerStartError(f"TP worker rank {rank} closed its pipe before it was ready") from None
                if isinstance(msg, WorkerFailed):
                    raise WorkerStartError(f"TP worker rank {rank} failed: {msg.message}")
                if isinstance(msg, WorkerReady):
                    ready[rank] = msg
                    del pending[rank]
        self.ready = [ready[r] for r in sorted(ready)]
        return self.ready

    @property
    def rank0(self) -> Connection:
        return self.conns[0]

    def dead_ranks(self) -> list[int]:
        return [r for r, p in enumerate(self.processes) if p.exitcode is not None]

    def stop(self, *, grace_s: float = 5.0) -> None:
        """Ask rank 0 to shut everyone down, then kill what is left (workers ignore SIGTERM)."""
        if not self.processes:
            return
        try:
            self.rank0.send(Shutdown())
        except (OSError, EOFError, BrokenPipeError):
            pass
        deadline = time.monotonic() + grace_s
        for proc in self.processes:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in self.processes:
            if proc.exitcode is None:
                logger.warning("%s (pid %d) did not exit within %.0fs; killing it", proc.name, proc.pid, grace_s)
                proc.kill()
                proc.join(5.0)
        for conn in self.conns:
            conn.close()
        logger.info("TP workers stopped (exit codes %s)", [p.exitcode for p in self.processes])

    def worker_info(self) -> list[dict[str, object]]:
        """What ``/server_info`` reports about each rank."""
        return [
            {
                "rank": r.rank,
                "world_size": r.world_size,
                "pid": r.pid,
                "device": r.device,
                "backend": r.backend,
                "process_name": r.process_name,
            }
            for r in self.ready
        ]

