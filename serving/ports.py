"""Choosing a port for a server that must be told its port on the command line.

Standard library only: the reference engine imports this on GPU machines that have nothing but
torch and aiohttp.
"""

from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (bind to 0, read it, release it).

    SGLang needs its port on the command line, so the port is chosen here and recorded; the small
    window before the server binds it is the same one SGLang's own test utilities accept.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
