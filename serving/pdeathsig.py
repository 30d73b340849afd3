"""Ask the kernel to signal this process when its parent dies (Linux ``PR_SET_PDEATHSIG``); stdlib only.

Used by the engine exec wrapper and the reference engine's TP workers. The signal survives
``execve`` and follows the parent *thread* that forked. Call it in the child itself, never in a
``preexec_fn``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal

__all__ = ["set_parent_death_signal"]

_PR_SET_PDEATHSIG = 1


def _libc() -> ctypes.CDLL:
    """glibc by its usual name first (``find_library`` would fork ``ldconfig -p``)."""
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def set_parent_death_signal(sig: int = signal.SIGTERM, *, expected_parent: int | None = None) -> bool:
    """Have the kernel send ``sig`` to this process when its parent exits.

    Args:
        sig: The signal to receive.
        expected_parent: The pid the parent had when this process was created. If the parent
            already died before the request was made (a race the kernel cannot see), the process
            has been re-parented; then this process exits at once rather than outlive it.

    Returns:
        Whether the request was made (False where prctl is unavailable, e.g. not Linux).
    """
    try:
        libc = _libc()
        made = libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        made = False
    if expected_parent is not None and os.getppid() != expected_parent:
        os._exit(1)
    return made
