"""Whole-or-nothing file writes for the harness's JSON documents (results, probe baselines).

A document is staged beside its target, fsynced, then published in one step: a replacing rename
(:func:`write_atomic`) or, for the probe's baseline, a hard link that refuses an existing file.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator

__all__ = ["staged_file", "write_atomic"]


@contextlib.contextmanager
def staged_file(path: Path, text: str) -> Iterator[Path]:
    """A temporary file beside ``path`` holding ``text``, on disk (fsynced), readable by all (0644).

    The caller publishes it (rename or link) inside the ``with``; whatever is left of it is removed
    on exit, so no temporary file outlives a failed publication.

    Raises:
        OSError: the directory cannot be created or the file cannot be written.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            os.fchmod(file.fileno(), 0o644)  # mkstemp's 0600 would hide the file from other users
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        yield tmp
    finally:
        tmp.unlink(missing_ok=True)


def write_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path``, replacing any file there in one step (``os.replace``).

    Raises:
        OSError: the file cannot be written; ``path`` is then unchanged.
    """
    target = Path(path)
    with staged_file(target, text) as tmp:
        os.replace(tmp, target)
    return target
