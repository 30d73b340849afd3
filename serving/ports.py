"""Choosing a port for a server that must be told its port on the command line (stdlib only).

A port found free (bind to 0, read it, release it) is free only until someone binds it, and two
engines started at once on one machine (two trials on one node, two "nodes" of a test cluster on
one host) can be handed the same one. :func:`free_port` therefore reserves each port it hands out
for :data:`RESERVE_S` with a file per port under the temp dir, so no other caller on the machine
gets it meanwhile.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
import uuid
from pathlib import Path

__all__ = ["RESERVE_S", "free_port"]

RESERVE_S = 120.0
"""How long a port handed out stays reserved on this machine (a server binds it well within that)."""

_TRIES = 64


def free_port(host: str = "127.0.0.1", *, reserve_dir: Path | None = None) -> int:
    """A port that was free a moment ago and that no other caller on this machine was handed in
    the last :data:`RESERVE_S` (``reserve_dir``: where the reservations are kept; default a folder
    of the user's under the temp dir). After many collisions it gives the last free port found."""
    folder = reserve_dir or Path(tempfile.gettempdir()) / f"spectune-ports-{os.getuid()}"
    folder.mkdir(parents=True, exist_ok=True)
    port = _bound_port(host)
    for _ in range(_TRIES):
        if _reserve(folder / str(port)):
            return port
        port = _bound_port(host)
    return port


def _bound_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _reserve(path: Path) -> bool:
    """Take the reservation ``path`` (a new file, or one older than :data:`RESERVE_S`); False
    where another caller holds it. A stale file is renamed away first, so one caller wins it."""
    for _ in range(2):
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            return True
        except FileExistsError:
            pass
        try:
            if time.time() - path.stat().st_mtime < RESERVE_S:
                return False
            stale = path.with_name(f"{path.name}.stale-{uuid.uuid4().hex}")
            os.rename(path, stale)
            stale.unlink(missing_ok=True)
        except FileNotFoundError:
            continue  # another caller moved it: try to create it again
    return False
