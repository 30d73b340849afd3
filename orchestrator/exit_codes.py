"""The exit codes of every ``spectune`` command, defined once (the CLI and its command modules import them).

0 success; 1 the command ran and failed (an audit mismatch, a dead server, outputs that differ
from the probe's baseline); 2 bad input (an invalid spec or option, an unreadable dataset or
baseline).
"""

from __future__ import annotations

__all__ = ["EXIT_BAD_INPUT", "EXIT_FAILED", "EXIT_OK"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
