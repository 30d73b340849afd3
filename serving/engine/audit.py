"""The env audit: prove every process of an engine carries the environment it was meant to get.

Reads ``/proc/<pid>/environ`` (the environment a process was started with) of the server and every
descendant and compares it with what was expected. Secret-looking values are redacted
(``serving.redaction``; ``redact`` and ``REDACTED`` are re-exported here).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping

import psutil

from serving.redaction import REDACTED, redact

__all__ = [
    "AuditReport",
    "ProcessAudit",
    "REDACTED",
    "audit_process_tree",
    "read_environ",
    "redact",
    "role_of",
]

_TP_WORKER = re.compile(r"(scheduler|::tp\d|_tp\d|tp_?worker)", re.I)


def read_environ(pid: int) -> dict[str, str]:
    """The environment process ``pid`` was started with (``/proc/<pid>/environ``).

    Raises:
        psutil.NoSuchProcess: the process is gone.
        psutil.AccessDenied: it belongs to another user.
    """
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            raw = handle.read()
    except (FileNotFoundError, ProcessLookupError):  # ESRCH: exited while being read, or a kernel thread
        raise psutil.NoSuchProcess(pid) from None
    except PermissionError:
        raise psutil.AccessDenied(pid) from None
    env: dict[str, str] = {}
    for entry in raw.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep:
            env[name.decode(errors="replace")] = value.decode(errors="replace")
    return env


def role_of(process: psutil.Process, *, root_pid: int) -> str:
    """``server`` (the launched process), ``tp_worker`` (SGLang scheduler / reference TP rank) or ``other``.

    Workers are recognised by their process title or name: SGLang names its schedulers
    ``sglang::scheduler_TP<r>``, the reference engine names its ranks ``ref::tp<r>``.
    """
    if process.pid == root_pid:
        return "server"
    try:
        names = " ".join([process.name(), *process.cmdline()[:3]])
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return "other"
    return "tp_worker" if _TP_WORKER.search(names) else "other"


@dataclass(frozen=True)
class ProcessAudit:
    """What one process carries compared with what it should.

    Attributes:
        pid: Process id.
        role: ``server``, ``tp_worker`` or ``other``.
        name: Process name / title (for humans).
        missing: Expected variables absent from its environment.
        mismatched: Variable -> (expected, actual), secrets redacted.
        error: Why the environment could not be read (the process exited, access denied).
    """

    pid: int
    role: str
    name: str
    missing: tuple[str, ...] = ()
    mismatched: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)
    error: str | None = None

    @property
    def ok(self) -> bool:
        """Whether this process carries every expected variable with the expected value."""
        return not self.missing and not self.mismatched and self.error is None

    def describe(self) -> str:
        """One line: pid, role and what is wrong."""
        what: list[str] = []
        if self.missing:
            what.append(f"missing {', '.join(self.missing)}")
        for name, (want, got) in self.mismatched.items():
            what.append(f"{name}={got!r} (expected {want!r})")
        if self.error:
            what.append(self.error)
        return f"pid {self.pid} ({self.role}, {self.name}): {'; '.join(what) or 'ok'}"


@dataclass(frozen=True)
class AuditReport:
    """The audit of one engine's process tree."""

    root_pid: int
    expected: dict[str, str | None]
    worker_expected: dict[str, str | None]
    processes: tuple[ProcessAudit, ...]

    @property
    def ok(self) -> bool:
        """Every process carries every expected variable, and the tree was readable."""
        return bool(self.processes) and all(p.ok for p in self.processes)

    @property
    def failures(self) -> list[ProcessAudit]:
        """The processes that do not carry what they should."""
        return [p for p in self.processes if not p.ok]

    def count(self, role: str) -> int:
        """How many processes of ``role`` were audited."""
        return sum(1 for p in self.processes if p.role == role)

    def summary(self) -> str:
        """Readable report: one line overall, then one per failing process."""
        roles = ", ".join(f"{self.count(r)} {r}" for r in ("server", "tp_worker", "other") if self.count(r))
        names = ", ".join(sorted({*self.expected, *self.worker_expected})) or "nothing"
        if self.ok:
            return f"env audit passed: {roles} all carry {names}"
        lines = [f"env audit FAILED for {len(self.failures)} of {len(self.processes)} processes ({roles}):"]
        lines += [f"  {p.describe()}" for p in self.failures]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """JSON-ready form (secrets already redacted)."""
        return {
            "ok": self.ok,
            "summary": self.summary(),
            "root_pid": self.root_pid,
            "expected": {k: redact(k, v) for k, v in self.expected.items()},
            "worker_expected": {k: redact(k, v) for k, v in self.worker_expected.items()},
            "processes": [
                {
                    "pid": p.pid,
                    "role": p.role,
                    "name": p.name,
                    "ok": p.ok,
                    "missing": list(p.missing),
                    "mismatched": {k: {"expected": w, "actual": g} for k, (w, g) in p.mismatched.items()},
                    "error": p.error,
                }
                for p in self.processes
            ],
        }


def _audit_one(
    process: psutil.Process, *, root_pid: int, expected: Mapping[str, str | None]
) -> ProcessAudit:
    role = role_of(process, root_pid=root_pid)
    try:
        name = process.name()
        env = read_environ(process.pid)
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return ProcessAudit(process.pid, role, "?", error="exited before it could be audited")
    except psutil.AccessDenied:
        return ProcessAudit(process.pid, role, "?", error="environment not readable (another user?)")
    missing = tuple(sorted(k for k in expected if k not in env))
    mismatched = {
        k: (redact(k, want), redact(k, env[k]))
        for k, want in sorted(expected.items())
        if k in env and want is not None and env[k] != want
    }
    return ProcessAudit(process.pid, role, name, missing, mismatched)


def audit_process_tree(
    *,
    root_pid: int,
    expected: Mapping[str, str | None],
    worker_expected: Mapping[str, str | None] | None = None,
) -> AuditReport:
    """Audit the process ``root_pid`` and all its descendants.

    Args:
        root_pid: The engine's server process (the one that was launched).
        expected: Variables every process must carry; a ``None`` value means "present, any value".
        worker_expected: Extra variables only TP workers must carry — those the engine sets itself
            before spawning them (see ``serving.engine.command.engine_managed_env``).

    Returns:
        The report; it is not ``ok`` if the root process does not exist.
    """
    worker_expected = dict(worker_expected or {})
    try:
        root = psutil.Process(root_pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        gone = ProcessAudit(root_pid, "server", "?", error="no such process")
        return AuditReport(root_pid, dict(expected), worker_expected, (gone,))
    audits = []
    for process in tree:
        wanted = dict(expected)
        if role_of(process, root_pid=root_pid) == "tp_worker":
            wanted.update(worker_expected)
        audits.append(_audit_one(process, root_pid=root_pid, expected=wanted))
    return AuditReport(root_pid, dict(expected), worker_expected, tuple(audits))
