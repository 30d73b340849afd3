"""EngineProcess: start an engine, wait until it serves, stop it and prove nothing is left.

The one lifecycle used by the sweep, by Serve and by the tests, for SGLang and the reference
engine alike. The engine runs in its own session (process group) so that the whole tree — server,
TP workers, their helpers — can be signalled at once; Ray does not reliably reap grandchildren,
so ``stop()`` does not return until every process of the tree is gone and the port is closed.
Output goes to a log file (never an unread pipe, which would block a chatty engine).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Mapping

import psutil

from serving.engine.command import EngineCommand, build_command
from serving.engine.config import EngineConfig
from serving.errors import EngineLaunchError, EngineNotReady, SpectuneError
from serving.ports import free_port

__all__ = ["EngineHealth", "EngineProcess", "StopReport", "free_port"]

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _die_with_parent_hook() -> Callable[[], None] | None:
    """A ``preexec_fn`` that asks the kernel to SIGTERM the engine if its launcher dies.

    This is what stops an engine whose host actor was SIGKILLed (``ray.kill``), which runs no
    finaliser. libc is resolved here, in the parent: between fork and exec the child of a
    multi-threaded process must not load libraries. The signal follows the launching *thread*;
    a synchronous Ray actor runs its methods on its main thread, which lives as long as the actor.
    """
    try:
        prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except OSError:
        logger.warning("libc not found: an engine will not be stopped if its launcher is killed")
        return None
    sigterm = int(signal.SIGTERM)

    def hook() -> None:  # runs in the child between fork and exec: no allocation-heavy work
        prctl(_PR_SET_PDEATHSIG, sigterm)

    return hook


_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))
"""Health checks go straight to the engine, whatever http_proxy says."""


@dataclass(frozen=True)
class EngineHealth:
    """Result of one health check.

    Attributes:
        alive: The server process is running.
        healthy: ``/health_generate`` answered 200.
        detail: Why not, in words (exit code, HTTP status, connection error).
    """

    alive: bool
    healthy: bool
    detail: str = ""


@dataclass(frozen=True)
class StopReport:
    """How an engine stopped.

    Attributes:
        exit_code: The server's exit code (negative: killed by that signal).
        escalated: SIGKILL was needed after the grace period.
        stopped_pids: Every process of the tree that was seen and is now gone.
    """

    exit_code: int | None
    escalated: bool
    stopped_pids: tuple[int, ...]


class EngineProcess:
    """One engine subprocess: ``start()``, ``wait_healthy()``, ``health()``, ``stop()``.

    Also a context manager: ``with EngineProcess.from_config(cfg, log_dir=d) as engine:`` starts
    it, waits until it is healthy (stopping it again if it never is) and stops it on exit.
    """

    def __init__(
        self,
        *,
        command: EngineCommand,
        log_path: Path,
        apply_env: bool = True,
        base_env: Mapping[str, str] | None = None,
        start_timeout_s: float = 600.0,
        die_with_parent: bool = False,
    ) -> None:
        """Prepare (not start) an engine.

        Args:
            command: What to run (argv, the config's env, host and port).
            log_path: File the engine's stdout and stderr are appended to.
            apply_env: Add ``command.env`` to the launch environment. The Ray host passes False:
                there the variables must arrive through the actor's runtime_env, and the audit
                proves they did.
            base_env: Environment to start from (default: this process's ``os.environ``).
            start_timeout_s: Default deadline for ``wait_healthy``.
            die_with_parent: Have the kernel SIGTERM the engine if this process dies.
        """
        self.command = command
        self.log_path = Path(log_path)
        self.apply_env = apply_env
        self.base_env = base_env
        self.start_timeout_s = start_timeout_s
        self.die_with_parent = die_with_parent
        self._popen: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._known: dict[int, psutil.Process] = {}
        self._started_at = 0.0

    @classmethod
    def from_config(
        cls,
        config: EngineConfig,
        *,
        log_dir: Path,
        host: str = "127.0.0.1",
        port: int | None = None,
        start_timeout_s: float = 600.0,
        apply_env: bool = True,
        die_with_parent: bool = False,
        python: str | None = None,
    ) -> "EngineProcess":
        """An EngineProcess for ``config`` on ``host``, on ``port`` or a free one."""
        chosen = port if port is not None else free_port(host)
        command = build_command(config, host=host, port=chosen, python=python)
        log_dir = Path(log_dir)
        log_dir.mkdir(parents=True, exist_ok=True)
        return cls(
            command=command,
            log_path=log_dir / f"engine-{config.kind}-{chosen}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log",
            start_timeout_s=start_timeout_s,
            apply_env=apply_env,
            die_with_parent=die_with_parent,
        )

    # --- properties ------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """Base URL of the engine's HTTP API."""
        return self.command.url

    @property
    def pid(self) -> int:
        """PID of the server process (the one launched)."""
        if self._popen is None:
            raise EngineNotReady("engine not started")
        return self._popen.pid

    @property
    def started(self) -> bool:
        """``start()`` was called and ``stop()`` was not (the process may have died since)."""
        return self._popen is not None

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the engine log ('' if there is none yet)."""
        try:
            with open(self.log_path, "rb") as handle:
                handle.seek(0, os.SEEK_END)
                size = handle.tell()
                handle.seek(max(0, size - 64 * 1024))
                text = handle.read().decode(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Launch the engine in its own session, output appended to ``log_path``."""
        if self._popen is not None:
            raise SpectuneError(f"engine on port {self.command.port} already started (pid {self._popen.pid})")
        env = dict(os.environ if self.base_env is None else self.base_env)
        if self.apply_env:
            env.update(self.command.env)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self._log.write(f"$ {self.command.shell(redacted=True)}\n".encode())
        self._log.flush()
        try:
            self._popen = subprocess.Popen(
                self.command.argv,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent_hook() if self.die_with_parent else None,
            )
        except OSError as exc:
            self._log.close()
            self._log = None
            raise EngineLaunchError(f"cannot run {self.command.argv[0]}: {exc}") from None
        self._started_at = time.time()
        self._known = {}
        self._remember_tree()
        logger.info("engine starting: pid %d, %s, log %s", self._popen.pid, self.url, self.log_path)

    def _get(self, path: str, *, timeout_s: float) -> int:
        """HTTP GET status code of ``path`` (raises OSError if the server cannot be reached)."""
        try:
            with _NO_PROXY.open(self.url + path, timeout=timeout_s) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    def wait_healthy(self, *, timeout_s: float | None = None, poll_s: float = 0.25) -> None:
        """Return once ``/health_generate`` answers 200.

        Checks ``poll()`` on every loop so a crashed engine fails at once, not at the deadline.

        Raises:
            EngineLaunchError: the engine exited, or was not healthy by the deadline; carries the
                exit code and the log tail. The engine is left running in the latter case (call
                ``stop()``).
        """
        popen = self._require_started()
        deadline = time.monotonic() + (self.start_timeout_s if timeout_s is None else timeout_s)
        last = "no answer yet"
        while True:
            code = popen.poll()
            if code is not None:
                raise EngineLaunchError(
                    f"engine exited with code {code} before becoming healthy ({self.url}, log {self.log_path})",
                    exit_code=code,
                    log_tail=self.log_tail(),
                )
            try:
                status = self._get("/health_generate", timeout_s=max(1.0, min(30.0, deadline - time.monotonic())))
                if status == 200:
                    self._remember_tree()
                    logger.info("engine ready: pid %d at %s", popen.pid, self.url)
                    return
                last = f"/health_generate answered HTTP {status}"
            except OSError as exc:
                last = f"cannot connect: {getattr(exc, 'reason', exc)}"
            if time.monotonic() >= deadline:
                raise EngineLaunchError(
                    f"engine not healthy after {timeout_s or self.start_timeout_s:g} s ({last}; "
                    f"pid {popen.pid}, log {self.log_path})",
                    exit_code=None,
                    log_tail=self.log_tail(),
                )
            time.sleep(poll_s)  # polling interval of a health loop, not synchronisation

    def health(self, *, timeout_s: float = 10.0) -> EngineHealth:
        """Check once: is the server alive, and does ``/health_generate`` answer 200?"""
        popen = self._require_started()
        code = popen.poll()
        if code is not None:
            how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
            return EngineHealth(alive=False, healthy=False, detail=f"engine {how}")
        try:
            status = self._get("/health_generate", timeout_s=timeout_s)
        except OSError as exc:
            return EngineHealth(alive=True, healthy=False, detail=f"cannot connect: {getattr(exc, 'reason', exc)}")
        self._remember_tree()
        ok = status == 200
        return EngineHealth(alive=True, healthy=ok, detail="" if ok else f"/health_generate answered HTTP {status}")

    def _require_started(self) -> subprocess.Popen[bytes]:
        if self._popen is None:
            raise EngineNotReady("engine not started; call start() first")
        return self._popen

    def _remember_tree(self) -> None:
        """Note every process of the tree seen so far, as psutil objects.

        After the server dies its workers are no longer its children, so they must be known from
        before. psutil objects (not bare pids) are kept because they refuse to signal a pid that
        has since been reused by an unrelated process.
        """
        if self._popen is None or self._popen.returncode is not None:
            return
        try:
            server = psutil.Process(self._popen.pid)
            tree = [server, *server.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        for proc in tree:
            self._known.setdefault(proc.pid, proc)

    def _tree(self) -> list[psutil.Process]:
        """Live processes of this engine: those seen before, current descendants, its process group.

        Group members are only counted if they started after the engine did, so a reused group
        id cannot pull in unrelated processes.
        """
        assert self._popen is not None
        self._remember_tree()
        group = self._popen.pid  # start_new_session: the server leads its own group
        found = dict(self._known)
        for proc in psutil.process_iter(["pid", "create_time"]):
            try:
                if proc.pid not in found and os.getpgid(proc.pid) == group and (
                    proc.info["create_time"] or 0
                ) >= self._started_at - 1.0:
                    found[proc.pid] = proc
            except (ProcessLookupError, PermissionError, psutil.NoSuchProcess):
                continue
        alive = []
        for proc in found.values():
            try:
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(proc)
            except psutil.NoSuchProcess:
                continue
        return alive

    def stop(self, *, grace_s: float = 15.0, port_timeout_s: float = 30.0) -> StopReport:
        """Stop the engine and return only when no process of it is alive and its port is closed.

        SIGTERM to the process group (SGLang and the reference engine shut their workers down on
        it), then after ``grace_s`` SIGKILL to every process of the tree still alive.

        Raises:
            SpectuneError: a process or the port survived SIGKILL (names the pids / port).
        """
        if self._popen is None:
            return StopReport(exit_code=None, escalated=False, stopped_pids=())
        popen = self._popen
        server = popen.pid
        tree = self._tree()
        escalated = False
        if tree:
            logger.info("stopping engine pid %d (%d processes)", server, len(tree))
            self._signal_tree(tree, signal.SIGTERM)
            try:
                popen.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
            # The server is reaped through Popen (psutil would steal its exit code); the rest here.
            others = [p for p in self._tree() if p.pid != server]
            _, still = psutil.wait_procs(others, timeout=max(0.1, grace_s / 3))
            if still or popen.poll() is None:
                escalated = True
                stubborn = sorted(p.pid for p in still) + ([server] if popen.poll() is None else [])
                logger.warning(
                    "engine pid %d did not stop within %.0f s of SIGTERM; sending SIGKILL to %s",
                    server, grace_s, stubborn,
                )
                self._signal_tree(self._tree(), signal.SIGKILL)
        try:
            exit_code = popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            exit_code = None
        leftovers = self._wait_gone(timeout_s=10)
        seen = set(self._known)
        if self._log is not None:
            self._log.close()
            self._log = None
        self._popen = None
        if leftovers:
            raise SpectuneError(f"engine processes survived SIGKILL: {sorted(leftovers)}")
        deadline = time.monotonic() + port_timeout_s
        while _port_open(self.command.host, self.command.port):
            if time.monotonic() >= deadline:
                raise SpectuneError(
                    f"port {self.command.port} still accepts connections {port_timeout_s:g} s after the engine stopped"
                )
            time.sleep(0.1)  # polling the port, not synchronisation
        logger.info("engine pid %d stopped (exit code %s)", server, exit_code)
        return StopReport(exit_code=exit_code, escalated=escalated, stopped_pids=tuple(sorted(seen)))

    def stop_quietly(self) -> None:
        """``stop()`` on a failure path: a problem while stopping is logged, never allowed to
        replace the error (with its log tail) that is already on its way up."""
        try:
            self.stop()
        except Exception:  # noqa: BLE001 - the original error matters more
            logger.exception("engine on port %d: cleanup after a failed start also failed", self.command.port)

    def _signal_tree(self, tree: list[psutil.Process], sig: signal.Signals) -> None:
        """Signal the process group (while its leader is unreaped, so the id is still ours) and
        every known process of the tree, including any that left the group (setsid)."""
        assert self._popen is not None
        if self._popen.poll() is None:
            try:
                os.killpg(self._popen.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        for proc in tree:
            try:
                proc.send_signal(sig)  # psutil refuses if the pid now belongs to another process
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue

    def _wait_gone(self, *, timeout_s: float) -> set[int]:
        """Wait until no process of the tree is alive; SIGKILL stragglers; return survivors."""
        assert self._popen is not None
        server = self._popen.pid
        deadline = time.monotonic() + timeout_s
        while True:
            live = [p for p in self._tree() if p.pid != server]
            if not live:
                return set()
            if time.monotonic() >= deadline:
                return {p.pid for p in live}
            self._signal_tree(live, signal.SIGKILL)
            psutil.wait_procs(live, timeout=0.5)

    # --- context manager -------------------------------------------------------------------

    def __enter__(self) -> "EngineProcess":
        self.start()
        try:
            self.wait_healthy()
        except BaseException:
            self.stop_quietly()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
