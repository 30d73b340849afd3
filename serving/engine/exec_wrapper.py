"""Exec an engine so that it dies with its launcher, without running Python between fork and exec.

The launcher runs this file (``wrapped_argv``) with ``-I -S``; it sets ``PR_SET_PDEATHSIG``
(``serving/pdeathsig.py``, loaded by path) and ``exec``s the engine's argv, so pid, process group
and ``/proc/<pid>/cmdline`` are the engine's. ``os.environ`` passes on unchanged except for what
the interpreter added itself (PEP 538's ``LC_CTYPE``) when the launcher did not give it.
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
        parent_pid: The launcher's pid: if it is gone when the wrapper asks for the death signal,
            the wrapper exits instead of starting the engine.
        env: The environment the wrapper will be started with (to know what to undo).
        python: Interpreter for the wrapper (default: this one).
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
    program cannot be executed / found; the reason goes to stderr (the engine log).
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
