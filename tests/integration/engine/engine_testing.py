"""Helpers for engine lifecycle tests (imported by name: pytest puts this folder on sys.path).

The engine config, the bounded wait and the environ reader are the shared ones of
``tests/engine_support.py`` (re-exported here for these tests' imports).
"""

from __future__ import annotations

import psutil
from engine_support import alive, processes_with_marker, reference_config, wait_until

__all__ = ["NCCL_ENV", "alive", "listening", "processes_with_marker", "reference_config", "wait_until"]

NCCL_ENV = {"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL", "NCCL_BUFFSIZE": "4194304", "NCCL_DEBUG": "INFO"}


def listening(port: int) -> bool:
    """Whether anything on this machine listens on TCP ``port``."""
    return any(
        c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
        for c in psutil.net_connections(kind="tcp")
    )
