"""ProcessTree: every process one launched engine ever had, so that all of it can be stopped.

The tree is the session leader's descendants as last seen (kept after re-parenting), plus any
process of its group created no earlier than the leader. Processes are kept as ``psutil.Process``
objects, which refuse to signal a reused pid. The leader is reaped by its launcher, never here.
"""

from __future__ import annotations

import os
import signal

import psutil

from serving.waiting import wait_until

__all__ = ["ProcessTree"]

_CREATE_TIME_SLACK_S = 1.0
"""Creation times are rounded to clock ticks; a group member is counted if created this close to
the leader (it cannot really be older: the group did not exist before the leader)."""


class ProcessTree:
    """The processes of one engine: its leader, every descendant seen, its process group."""

    def __init__(self, leader_pid: int) -> None:
        """Start tracking the tree of ``leader_pid``; call right after launching it, before anything can reap it.

        Raises:
            psutil.NoSuchProcess: the leader is already gone and reaped.
        """
        self._leader = psutil.Process(leader_pid)
        self._created = self._leader.create_time()
        self._known: dict[int, psutil.Process] = {leader_pid: self._leader}

    @property
    def leader_pid(self) -> int:
        """The launched process, which leads the process group."""
        return self._leader.pid

    @property
    def seen(self) -> tuple[int, ...]:
        """Every pid of the tree seen so far, sorted (live or not)."""
        return tuple(sorted(self._known))

    def _leader_unreaped(self) -> bool:
        """The leader (alive or a zombie) still holds its pid, so its group id is still ours."""
        return self._leader.is_running()

    def remember(self) -> None:
        """Note the leader's current descendants (no-op once the leader is gone)."""
        if not self._leader_unreaped():
            return
        try:
            children = self._leader.children(recursive=True)
        except psutil.NoSuchProcess:
            return
        for proc in children:
            self._known.setdefault(proc.pid, proc)

    def live(self, *, include_leader: bool = True) -> list[psutil.Process]:
        """Live (non-zombie) processes of the tree: those seen, current descendants, group members."""
        self.remember()
        group = self._leader.pid
        for proc in psutil.process_iter(["create_time"]):
            try:
                if (
                    proc.pid not in self._known
                    and os.getpgid(proc.pid) == group
                    and (proc.info["create_time"] or 0) >= self._created - _CREATE_TIME_SLACK_S
                ):
                    self._known[proc.pid] = proc  # from now on tracked even if it leaves the group
            except (ProcessLookupError, PermissionError, psutil.NoSuchProcess):
                continue
        found = dict(self._known)
        if not include_leader:
            found.pop(self._leader.pid, None)
        alive = []
        for proc in found.values():
            try:
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(proc)
            except psutil.NoSuchProcess:
                continue
        return alive

    def signal(self, sig: signal.Signals, processes: list[psutil.Process] | None = None) -> None:
        """Send ``sig`` to the process group (while its leader is unreaped) and to each of ``processes``
        (default: ``live()``), which reaches those that left the group."""
        targets = self.live() if processes is None else processes
        if self._leader_unreaped():
            try:
                os.killpg(self._leader.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        for proc in targets:
            try:
                proc.send_signal(sig)  # psutil refuses if the pid now belongs to another process
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue

    def wait_gone(self, *, timeout_s: float) -> set[int]:
        """SIGKILL every process of the tree but the leader until none is left.

        Returns:
            The pids still alive after ``timeout_s`` (empty: the tree is gone).
        """

        def gone() -> bool:
            live = self.live(include_leader=False)
            if live:
                self.signal(signal.SIGKILL, live)
                psutil.wait_procs(live, timeout=0.5)
            return not live

        try:
            wait_until(gone, timeout_s=timeout_s, what="the engine's processes to exit", poll_s=0.0)
        except TimeoutError:
            return {p.pid for p in self.live(include_leader=False)}
        return set()
