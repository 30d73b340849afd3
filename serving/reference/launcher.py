"""Starting and stopping the TP worker processes (multiprocessing *spawn*, one per rank).

A node's engine process spawns its own node's ranks (``ServerArgs.node_tp_ranks``) with their
global rank numbers; they inherit ``os.environ`` as it is at ``start()``.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
import time
from multiprocessing.connection import Connection, wait
from typing import Any, Optional, Sequence

from serving.ports import free_port
from serving.reference.faults import CORRUPTION, EnvCondition, Faults
from serving.reference.protocol import Shutdown, WorkerFailed, WorkerReady
from serving.reference.server_args import ServerArgs
from serving.reference.tp_worker import WorkerConfig, run_worker

__all__ = ["RankExit", "WorkerGroup", "WorkerStartError"]

logger = logging.getLogger(__name__)


class WorkerStartError(RuntimeError):
    """A worker died or reported a failure before it was ready."""


@dataclasses.dataclass(frozen=True)
class RankExit:
    """How the first of a node's ranks to exit ended (``WorkerGroup.wait_first_exit``).

    Attributes:
        rank: Its global TP rank.
        exit_code: Its exit status (negative: killed by that signal); 0 after rank 0's shutdown
            broadcast, 1 after a failure (a collective with a rank that is gone, among others).
        message: What it reported before exiting (``WorkerFailed``), or None.
    """

    rank: int
    exit_code: Optional[int]
    message: Optional[str] = None

    @property
    def clean(self) -> bool:
        return self.exit_code == 0

    def describe(self) -> str:
        how = f"killed by signal {-self.exit_code}" if self.exit_code is not None and self.exit_code < 0 else (
            f"exited with code {self.exit_code}")
        return f"TP rank {self.rank} {how}" + (f" ({self.message})" if self.message else "")


class WorkerGroup:
    """The worker processes of this node's TP ranks (``processes``, ``conns`` in rank order).

    Args:
        args: Resolved server arguments.
        hide_env: Variable names to keep out of the workers' environment (``late_env`` fault).
        corrupt_allreduce_when: The ``corrupt_allreduce_when`` fault's condition; each worker
            checks it against its own environment.
        die_after_steps: The ``die_after_steps`` fault's N where it is armed on this node (None:
            off); this node's first rank carries it out.
        corruption_share: ``corrupt_allreduce_when``'s share of the neighbour added.
        perturb_verify: The ``perturb_verify`` fault's relative size (None: off).
        pcie_ipc_build_fails: The ``pcie_ipc_build_fails`` fault: every rank's PCIe-IPC workspace build fails.
    """

    def __init__(
        self, *, args: ServerArgs, hide_env: Sequence[str] = (), corrupt_allreduce_when: Optional[EnvCondition] = None,
        die_after_steps: Optional[int] = None, corruption_share: float = CORRUPTION, perturb_verify: Optional[float] = None,
        pcie_ipc_build_fails: bool = False,
    ) -> None:
        self.args = args
        self.ranks = args.node_tp_ranks
        self.hide_env = tuple(hide_env)
        self.corrupt_allreduce_when = corrupt_allreduce_when
        self.die_after_steps = die_after_steps
        self.corruption_share = corruption_share
        self.perturb_verify = perturb_verify
        self.pcie_ipc_build_fails = pcie_ipc_build_fails
        self.processes: list[multiprocessing.process.BaseProcess] = []
        self.conns: list[Connection] = []
        self.ready: list[WorkerReady] = []

    @classmethod
    def with_faults(cls, *, args: ServerArgs, faults: Faults) -> "WorkerGroup":
        """The group with the fault switches that act in the workers, ``die_after_steps`` armed
        only on its node (the log says armed or off, on every node)."""
        steps = faults.steps_before_death(args.node_rank)
        if faults.die_after_steps is not None:
            node = faults.die_after_steps_node
            where = f"@node_rank={node}" if node is not None else ""
            if faults.die_after_steps_when is not None:
                where += f"@{faults.die_after_steps_when}"
            if steps is not None:
                logger.warning(
                    "fault die_after_steps:%d%s: armed on this node (node_rank %d): its engine process and ranks %s "
                    "die hard after %d steps", steps, where, args.node_rank, list(args.node_tp_ranks), steps,
                )
            else:
                logger.warning("fault die_after_steps:%d%s: this is node_rank %d%s; off here",
                               faults.die_after_steps, where, args.node_rank,
                               "" if faults.die_after_steps_when is None else " or its condition does not hold")
            if node is not None and node >= args.nnodes and args.node_rank == 0:
                logger.warning("fault die_after_steps:%d%s: node_rank %d is not a node of this engine (--nnodes %d); "
                               "it never fires", faults.die_after_steps, where, node, args.nnodes)
        if faults.perturb_verify is not None:
            logger.warning("fault perturb_verify:%g: every verify pass's logits are scaled by 1 +/- %g (rounding-sized "
                           "numerics, as on a GPU)", faults.perturb_verify, faults.perturb_verify)
        return cls(args=args, hide_env=faults.late_env, corrupt_allreduce_when=faults.corrupt_allreduce_when,
                   die_after_steps=steps, corruption_share=faults.corruption_share, perturb_verify=faults.perturb_verify,
                   pcie_ipc_build_fails=faults.pcie_ipc_build_fails)

    @property
    def has_rank0(self) -> bool:
        """Whether rank 0 (the one that takes requests and broadcasts them) is on this node."""
        return 0 in self.ranks

    def start(self) -> None:
        """Spawn one process per rank of this node (returns at once; see ``wait_ready``)."""
        args = self.args
        ctx = multiprocessing.get_context("spawn")
        # Without --dist-init-addr each node meets at a free port of its own, as in SGLang.
        addr = args.dist_init_addr or f"127.0.0.1:{free_port()}"
        hidden = {name: os.environ.pop(name) for name in self.hide_env if name in os.environ}
        if hidden:
            logger.warning(
                "fault late_env: spawning workers without %s (restored in this process afterwards)",
                ", ".join(sorted(hidden)),
            )
        try:
            for rank in self.ranks:
                cfg = WorkerConfig(
                    args=args,
                    rank=rank,
                    init_method=f"tcp://{addr}",
                    parent_pid=os.getpid(),
                    corrupt_allreduce_when=self.corrupt_allreduce_when,
                    corruption_share=self.corruption_share,
                    perturb_verify=self.perturb_verify,
                    pcie_ipc_build_fails=self.pcie_ipc_build_fails,
                    die_after_steps=self.die_after_steps if rank == self.ranks[0] else None,
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
        pending = dict(zip(self.ranks, self.conns))
        process = dict(zip(self.ranks, self.processes))
        ready: dict[int, WorkerReady] = {}
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WorkerStartError(f"TP workers {sorted(pending)} not ready after {timeout_s:.0f}s")
            sentinels = {process[r].sentinel: r for r in pending}
            for obj in wait(list(pending.values()) + list(sentinels), timeout=min(left, 1.0)):
                if obj in sentinels:
                    rank = sentinels[obj]
                    if rank in pending and not pending[rank].poll():
                        code = process[rank].exitcode
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
        """The pipe to rank 0 (node 0 only: the HTTP side's link to the engine)."""
        assert self.has_rank0, f"rank 0 is on node 0, not on node_rank {self.args.node_rank}"
        return self.conns[0]

    def dead_ranks(self) -> list[int]:
        return [r for r, p in zip(self.ranks, self.processes) if p.exitcode is not None]

    def wait_first_exit(self) -> RankExit:
        """Block until one of this node's ranks exits; how it ended (with what it reported)."""
        by_sentinel = {p.sentinel: (r, p) for r, p in zip(self.ranks, self.processes)}
        open_conns = dict(zip(self.conns, self.ranks))
        said: dict[int, str] = {}

        def read(conn: Connection) -> bool:
            """Take one message from ``conn``; False once it is closed (at either end)."""
            try:
                if not conn.poll():
                    return False
                msg = conn.recv()
            except (EOFError, OSError, ValueError):
                open_conns.pop(conn, None)
                return False
            if isinstance(msg, WorkerFailed):
                said[open_conns[conn]] = msg.message
            return True

        while True:
            try:
                ready = wait([*by_sentinel, *open_conns])
            except (OSError, ValueError):  # stop() closed the pipes under us: the ranks are being stopped
                ready = list(by_sentinel)
            for obj in ready:
                if obj in open_conns:
                    read(obj)
                    continue
                rank, proc = by_sentinel[obj]
                proc.join(5.0)
                conn = self.conns[self.ranks.index(rank)]
                while conn in open_conns and read(conn):  # a failure it sent just before exiting
                    pass
                return RankExit(rank=rank, exit_code=proc.exitcode, message=said.get(rank))

    def stop(self, *, grace_s: float = 5.0) -> None:
        """Ask rank 0 to shut everyone down (on node 0), then kill what is left after ``grace_s``."""
        if not self.processes:
            return
        if self.has_rank0:
            try:
                self.rank0.send(Shutdown())
            except (OSError, EOFError, BrokenPipeError):
                pass
        deadline = time.monotonic() + grace_s
        for proc in self.processes:
            _join(proc, max(0.0, deadline - time.monotonic()))
        for proc in self.processes:
            if proc.exitcode is None:
                logger.warning("%s (pid %d) did not exit within %.0fs; killing it", proc.name, proc.pid, grace_s)
                proc.kill()
                _join(proc, 5.0)
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


def _join(proc: Any, timeout_s: float) -> None:
    """``proc.join`` until it has an exit code or ``timeout_s`` passed. A process's sentinel can be
    ready (its descriptors closed as it exits) a moment before it can be reaped, and ``join`` then
    returns with no exit code yet: seen in CI as "did not exit within 5s; killing it" logged at once
    for a rank that was exiting cleanly."""
    deadline = time.monotonic() + timeout_s
    while True:
        proc.join(max(0.0, deadline - time.monotonic()))
        if proc.exitcode is not None or time.monotonic() >= deadline:
            return
        time.sleep(0.01)
