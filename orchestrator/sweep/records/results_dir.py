"""Where a sweep's results go (an absolute path, never in Ray's temporary working-directory copy),
and moving an earlier sweep's outputs there to ``history/<time>/``.
"""

from __future__ import annotations

import logging
import shutil
from datetime import datetime
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from orchestrator.sweep.records.results import CONFIRMATION_FILE, STATE_FILE, TRIALS_FILE
from serving.environ import ENV

__all__ = ["archive_previous", "resolve_results_dir"]

logger = logging.getLogger(__name__)

_RAY_WORKING_DIR_MARKER = "runtime_resources"
"""Part of the path of the copy ``ray job submit --working-dir`` runs in (inside Ray's session dir)."""


def resolve_results_dir(results_dir: str, override: str | None = None, *, cwd: Path | None = None) -> Path:
    """Where results go, as an absolute path a person can find afterwards.

    ``--results-dir`` (``override``) wins; an absolute ``results_dir`` (the spec's) is used as is, a
    relative one from the working directory, or under ``$SPECTUNE_RESULTS_ROOT`` (default
    ``~/spectune-results``) when that is Ray's temporary copy of the working directory.
    """
    if override:
        return Path(override).expanduser().resolve()
    path = Path(results_dir).expanduser()
    if path.is_absolute():
        return path
    here = (cwd or Path.cwd()).resolve()
    if _RAY_WORKING_DIR_MARKER in here.parts or "working_dir_files" in str(here):
        root = Path(ENV.SPECTUNE_RESULTS_ROOT.get() or Path.home() / "spectune-results")
        logger.warning(
            "running inside Ray's temporary copy of the working directory (%s): a relative results_dir would "
            "vanish with it; writing to %s instead (pass --results-dir /absolute/path to choose)", here, root / path,
        )
        return (root / path).resolve()
    return (here / path).resolve()


def archive_previous(results_dir: Path, console: Console) -> None:
    """Move an earlier sweep's outputs in ``results_dir`` to ``history/<time>/`` (the MLflow database stays)."""
    outputs = [TRIALS_FILE, STATE_FILE, CONFIRMATION_FILE, "spec.yaml", "best.yaml", "best.json", "summary.json", "summary.txt", "probe-baseline.json",
               "plots", "tune"]
    present = [name for name in outputs if (results_dir / name).exists()]
    if not present:
        return
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    target = results_dir / "history" / stamp
    target.mkdir(parents=True, exist_ok=True)
    for name in present:
        shutil.move(str(results_dir / name), str(target / name))
    console.print(f"an earlier sweep's outputs in {escape(str(results_dir))} were moved to {escape(str(target))} "
                  "(to continue an interrupted sweep instead, run with --resume)", highlight=False)
