"""Exec an engine so that it dies with its launcher, without running Python between fork and exec.

An engine launched from a Ray actor must not outlive the actor: ``ray.kill`` SIGKILLs it, and no
finaliser runs. The kernel can do it (``PR_SET_PDEATHSIG``), but the request has to be made in
the child. Doing that in a ``preexec_fn`` runs Python between ``fork`` and ``exec`` in the
launcher's child, which Python's documentation warns can deadlock when the launcher has threads
(a Ray actor always has): the child inherits locks held by threads that do not exist in it.

So the launcher execs this file instead (``fork`` and ``exec`` are then done in C by
``subprocess``), and this file — a fresh, single-threaded interpreter — sets the death signal and
``exec``s the engine's own argv. After the exec the pid is the engine's: ``Popen.pid``, the
process group, the audit's "server process" and ``/proc/<pid>/cmdline`` are exactly what they
would be without the wrapper. The death signal survives ``exec``.

It runs by file path with ``-I -S`` (isolated, no ``site``): it starts fast and does not depend on
the launch environment's ``PYTHONPATH`` or on the package being importable; it loads only the
stdlib-only ``serving/pdeathsig.py``, by path. ``os.environ`` passes to the engine unchanged, with
one correction: an interpreter started in the C locale adds ``LC_CTYPE`` to its own environment
(PEP 538), which the engine must not inherit when the launcher did not give it.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Mapping, Sequence

__all__ = ["wrapped_argv"]

_ADDED_BY_INTERPRETER = ("LC_CTYPE",)
"""Variables a Python interpreter may add to its own environment at start-up (PEP 538)."""


def wrapped_argv(
    argv: Sequence[str], *, parent_pid: int, env: Mapping[str, str], python: str | None = None
) -> list[str]:
    """The command line that runs ``argv`` through this wrapper.

    Args:
        argv: The engine's command line, program first (searched on ``env``'s PATH).
        parent_pid: The launcher's pid: if it is already gone when the wrapper asks for the death
            signal (a race the kernel cannot see), the wrapper exits instead of starting the engine.
        env: The environment the wrapper will be started with (to know what to undo, see above).
        python: Interpreter for the wrapper (default: this one, which certainly exists).
    """
    unset = ",".join(name for name in _ADDED_BY_INTERPRETER if name not in env)
    return [python or sys.executable, "-I", "-S", os.path.abspath(__file__), str(parent_pid), unset, "--", *argv]


def _load_pdeathsig():  # type: ignore[no-untyped-def]
    """``serving/pdeathsig.py`` by path: under ``-I`` the package is not importable by name."""
    from importlib.util import module_from_spec, spec_from_file_location

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pdeathsig.py")
    spec = spec_from_file_location("_spectune_pdeathsig", path)
    assert spec is not None and spec.loader is not None
    module = module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(args: Sequence[str]) -> int:
    """``PARENT_PID UNSET_NAMES -- ARGV...``: set the death signal, then become ``ARGV``.

    Returns only on failure: 2 for a malformed command line, 126/127 (as a shell would) when the
    program cannot be executed / found; the reason goes to stderr, which is the engine log.
    """
    if len(args) < 4 or args[2] != "--":
        sys.stderr.write(f"usage: {os.path.basename(__file__)} PARENT_PID UNSET_NAMES -- ARGV...\n")
        return 2
    parent, unset, argv = int(args[0]), args[1], list(args[3:])
    _load_pdeathsig().set_parent_death_signal(signal.SIGTERM, expected_parent=parent)
    env = dict(os.environ)
    for name in filter(None, unset.split(",")):
        env.pop(name, None)
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        sys.stderr.write(f"spectune: cannot run {argv[0]!r}: {exc}\n")
        return 126 if isinstance(exc, PermissionError) else 127
    return 0  # not reached: exec replaced this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
