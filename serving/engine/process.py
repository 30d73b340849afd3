"""EngineProcess: start an engine, wait until it serves, stop it and prove nothing is left.

The one lifecycle used by the sweep, by Serve and by the tests, for SGLang and the reference engine
alike. The engine runs in its own session, its output goes to a log file, and ``stop()`` returns
only once every process of its tree (``ProcessTree``) is gone and its port is closed. Failures are
``serving.errors.EngineError`` subclasses.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Mapping

import psutil

from serving.engine.command import EngineCommand, build_command
from serving.engine.config import EngineConfig
from serving.engine.exec_wrapper import wrapped_argv
from serving.engine.process_tree import ProcessTree
from serving.errors import (
    EngineAlreadyStarted,
    EngineDied,
    EngineError,
    EngineLaunchError,
    EngineNotReady,
    EngineStartTimeout,
    EngineStopError,
)
from serving.local_http import open_direct
from serving.ports import free_port
from serving.waiting import wait_until

__all__ = ["EngineHealth", "EngineProcess", "StopReport", "free_port"]

logger = logging.getLogger(__name__)


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _exit_words(code: int) -> str:
    return f"killed by signal {-code}" if code < 0 else f"exited with code {code}"


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
            apply_env: Add ``command.env`` to the launch environment (False where the variables must
                arrive through a Ray runtime_env, which the audit then proves).
            base_env: Environment to start from (default: this process's ``os.environ``).
            start_timeout_s: Default deadline for ``wait_healthy``.
            die_with_parent: Have the kernel SIGTERM the engine if this process dies (through
                ``serving.engine.exec_wrapper``; argv and pid are unchanged).
        """
        self.command = command
        self.log_path = Path(log_path)
        self.apply_env = apply_env
        self.base_env = base_env
        self.start_timeout_s = start_timeout_s
        self.die_with_parent = die_with_parent
        self._popen: subprocess.Popen[bytes] | None = None
        self._launch_env: dict[str, str] | None = None
        self._log: IO[bytes] | None = None
        self._tree: ProcessTree | None = None
        self._was_healthy = False

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
        node_rank: int = 0,
        dist_init_addr: str | None = None,
    ) -> "EngineProcess":
        """An EngineProcess for ``config`` on ``host``, on ``port`` or a free one (``node_rank`` and
        ``dist_init_addr``: this node's part of an engine across nodes, see ``build_command``)."""
        if config.nnodes > 1 and dist_init_addr is None:
            raise ValueError(f"an engine across nnodes={config.nnodes} needs dist_init_addr (node rank 0's host:port)")
        chosen = port if port is not None else free_port(host)
        command = build_command(config, host=host, port=chosen, python=python, node_rank=node_rank,
                                dist_init_addr=dist_init_addr)
        log_dir = Path(log_dir)
        log_dir.mkdir(parents=True, exist_ok=True)
        return cls(
            command=command,
            log_path=log_dir / f"engine-{config.kind}-{chosen}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log",
            start_timeout_s=start_timeout_s,
            apply_env=apply_env,
            die_with_parent=die_with_parent,
        )

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
    def launch_env(self) -> dict[str, str]:
        """The whole environment the server process was started with (a copy), as
        ``serving.engine.command.engine_managed_env`` reads it."""
        if self._launch_env is None:
            raise EngineNotReady("engine not started")
        return dict(self._launch_env)

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

    def start(self) -> None:
        """Launch the engine in its own session, output appended to ``log_path``.

        Raises:
            EngineAlreadyStarted: it is running already.
            EngineLaunchError: the program cannot be found or run (nothing was started).
        """
        if self._popen is not None:
            raise EngineAlreadyStarted(
                f"engine on port {self.command.port} already started (pid {self._popen.pid}); stop() it first"
            )
        env = dict(os.environ if self.base_env is None else self.base_env)
        if self.apply_env:
            env.update(self.command.env)
        program = self.command.argv[0]
        if shutil.which(program, path=env.get("PATH", os.defpath)) is None:
            # through the exec wrapper a missing program would only show as an exit code
            raise EngineLaunchError(f"cannot run {program!r}: not an executable file, nor on the launch PATH")
        argv = (
            wrapped_argv(self.command.argv, parent_pid=os.getpid(), env=env)
            if self.die_with_parent
            else list(self.command.argv)
        )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        log.write(f"$ {self.command.shell(redacted=True)}\n".encode())
        log.flush()
        try:
            popen = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        except OSError as exc:
            log.close()
            raise EngineLaunchError(f"cannot run {argv[0]}: {exc}") from None
        self._popen, self._log, self._was_healthy = popen, log, False
        self._launch_env = env
        self._tree = ProcessTree(popen.pid)  # before anything can reap it
        logger.info("engine starting: pid %d, %s, log %s", popen.pid, self.url, self.log_path)

    def _get(self, path: str, *, timeout_s: float) -> int:
        """HTTP GET status code of ``path`` (raises OSError if the server cannot be reached)."""
        try:
            with open_direct(self.url + path, timeout_s=timeout_s) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    def _exited(self, code: int) -> EngineError:
        """The error for an engine found exited: ``died`` if it had been healthy, else ``launch_failed``."""
        where = f"{self.url}, log {self.log_path}"
        if self._was_healthy:
            return EngineDied(
                f"engine {_exit_words(code)} after it had been healthy ({where})", exit_code=code, log_tail=self.log_tail()
            )
        return EngineLaunchError(
            f"engine exited with code {code} before becoming healthy ({where})", exit_code=code, log_tail=self.log_tail()
        )

    def wait_healthy(self, *, timeout_s: float | None = None, poll_s: float = 0.25) -> None:
        """Return once ``/health_generate`` answers 200; an engine that exits fails at once.

        Raises:
            EngineLaunchError: the engine exited before it was ever healthy (``launch_failed``).
            EngineDied: it exited after it had been healthy (``died``).
            EngineStartTimeout: it was not healthy by the deadline (``timeout``); it is left
                running (call ``stop()``).
            EngineNotReady: it was not started.
        """
        popen = self._require_started()
        budget = self.start_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + budget
        last = ["no answer yet"]

        def healthy() -> bool:
            code = popen.poll()
            if code is not None:
                raise self._exited(code)
            try:
                status = self._get("/health_generate", timeout_s=max(1.0, min(30.0, deadline - time.monotonic())))
            except OSError as exc:
                last[0] = f"cannot connect: {getattr(exc, 'reason', exc)}"
                return False
            last[0] = f"/health_generate answered HTTP {status}"
            return status == 200

        try:
            wait_until(healthy, timeout_s=budget, what=f"{self.url}/health_generate", poll_s=poll_s)
        except TimeoutError:
            raise EngineStartTimeout(
                f"engine not healthy after {budget:g} s ({last[0]}; pid {popen.pid}, log {self.log_path})",
                log_tail=self.log_tail(),
            ) from None
        self._healthy_now()
        logger.info("engine ready: pid %d at %s", popen.pid, self.url)

    def _healthy_now(self) -> None:
        self._was_healthy = True
        assert self._tree is not None
        self._tree.remember()

    def health(self, *, timeout_s: float = 10.0) -> EngineHealth:
        """Check once: is the server alive, and does ``/health_generate`` answer 200?"""
        popen = self._require_started()
        code = popen.poll()
        if code is not None:
            return EngineHealth(alive=False, healthy=False, detail=f"engine {_exit_words(code)}")
        try:
            status = self._get("/health_generate", timeout_s=timeout_s)
        except OSError as exc:
            return EngineHealth(alive=True, healthy=False, detail=f"cannot connect: {getattr(exc, 'reason', exc)}")
        assert self._tree is not None
        self._tree.remember()
        if status != 200:
            return EngineHealth(alive=True, healthy=False, detail=f"/health_generate answered HTTP {status}")
        self._healthy_now()
        return EngineHealth(alive=True, healthy=True)

    def check_healthy(self, *, timeout_s: float = 10.0) -> None:
        """``health()`` as an exception, for callers that must fail (Serve's ``check_health``).

        Raises:
            EngineDied: it exited after it had been healthy.
            EngineLaunchError: it exited before it was ever healthy.
            EngineNotReady: it is alive but not healthy, or was not started.
        """
        popen = self._require_started()
        result = self.health(timeout_s=timeout_s)
        if result.healthy:
            return
        code = popen.poll()
        if code is not None:
            raise self._exited(code)
        raise EngineNotReady(f"engine pid {popen.pid} at {self.url} is not healthy: {result.detail}")

    def _require_started(self) -> subprocess.Popen[bytes]:
        if self._popen is None:
            raise EngineNotReady("engine not started; call start() first")
        return self._popen

    def stop(self, *, grace_s: float = 15.0, port_timeout_s: float = 30.0) -> StopReport:
        """Stop the engine and return only when no process of it is alive and its port is closed.

        SIGTERM to the process group, then after ``grace_s`` SIGKILL to every process of the tree still
        alive.

        Raises:
            EngineStopError: a process or the port survived SIGKILL (``survivors`` / ``port`` name
                them). The engine counts as stopped either way: a second ``stop()`` is a no-op.
        """
        if self._popen is None:
            return StopReport(exit_code=None, escalated=False, stopped_pids=())
        popen, tree = self._popen, self._tree
        assert tree is not None
        server = popen.pid
        live = tree.live()
        escalated = False
        if live:
            logger.info("stopping engine pid %d (%d processes)", server, len(live))
            tree.signal(signal.SIGTERM, live)
            try:
                popen.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
            # The server is reaped through Popen (psutil would steal its exit code); the rest here.
            _, still = psutil.wait_procs(tree.live(include_leader=False), timeout=max(0.1, grace_s / 3))
            if still or popen.poll() is None:
                escalated = True
                stubborn = sorted(p.pid for p in still) + ([server] if popen.poll() is None else [])
                logger.warning(
                    "engine pid %d did not stop within %.0f s of SIGTERM; sending SIGKILL to %s",
                    server, grace_s, stubborn,
                )
                tree.signal(signal.SIGKILL)
        try:
            exit_code: int | None = popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            exit_code = None
        leftovers = tree.wait_gone(timeout_s=10) | ({server} if exit_code is None else set())
        if self._log is not None:
            self._log.close()
        self._popen, self._tree, self._log = None, None, None
        if leftovers:
            raise EngineStopError(
                f"engine processes survived SIGKILL: {sorted(leftovers)}",
                survivors=tuple(sorted(leftovers)), exit_code=exit_code, log_tail=self.log_tail(),
            )
        host, port = self.command.host, self.command.port
        try:
            wait_until(lambda: not _port_open(host, port), timeout_s=port_timeout_s, what=f"port {port} to close", poll_s=0.1)
        except TimeoutError:
            raise EngineStopError(
                f"port {port} still accepts connections {port_timeout_s:g} s after the engine stopped",
                port=port, exit_code=exit_code,
            ) from None
        logger.info("engine pid %d stopped (exit code %s)", server, exit_code)
        return StopReport(exit_code=exit_code, escalated=escalated, stopped_pids=tree.seen)

    def stop_quietly(self) -> None:
        """``stop()`` on a failure path: a problem while stopping is logged, never raised over the error
        already on its way up."""
        try:
            self.stop()
        except Exception:  # noqa: BLE001 - the original error matters more
            logger.exception("engine on port %d: cleanup after a failed start also failed", self.command.port)

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
