"""The night's answer as of now: ``best.yaml`` and the summary, rewritten after every recorded trial
and confirmation visit, so a sweep killed at any moment (``ray job stop`` sends SIGKILL 3 s after
SIGTERM) leaves an answer a user can act on.

Until a verdict says otherwise, best.yaml holds SGLang's default configuration; the best complete ok
trial measured so far is named in its comments as an *unconfirmed candidate*, with its engine command.
The three files are written into a fresh folder and published together by one atomic rename of the
``morning`` link (``best.yaml``, ``summary.json`` and ``summary.txt`` in the results directory are
links into it): a kill at any moment leaves the last complete set, and every file of a set carries
the same ``as_of`` stamp. ``finish.finish_sweep`` replaces them with the final files
(:func:`retire_morning_files`). Cheap on purpose: no MLflow, no plots.
"""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any, Iterable


from orchestrator.spec import SweepSpec
from orchestrator.sweep.records.results import (
    STATE_FILE, TrialRecord, best_record, best_yaml_text, served_engine_config,
)
from orchestrator.timestamps import utc_timestamp

__all__ = ["MORNING_FILES", "MORNING_LINK", "default_engine_config", "engine_command", "morning_texts", "read_as_of",
           "retire_morning_files", "write_morning_files"]

logger = logging.getLogger(__name__)

MORNING_LINK = "morning"
"""The link in the results directory naming the folder of the current set (``.morning-<stamp>``)."""

MORNING_FILES = ("best.yaml", "summary.json", "summary.txt")
"""The files of one set; in the results directory each is a link into :data:`MORNING_LINK`."""

AS_OF_PREFIX = "as_of: "
"""How best.yaml's comment line with the set's stamp begins (``# as_of: t3-v0 2026-...``)."""


def default_engine_config(spec: SweepSpec, records: Iterable[TrialRecord]) -> tuple[dict[str, Any], TrialRecord | None]:
    """SGLang's default configuration (the ``baseline_auto`` trial's; without speculation in the
    space, the plain baseline's) and its trial where one ended ok; else as the spec makes it."""
    from orchestrator.space.define_by_run import DefineByRunSpace

    plan = DefineByRunSpace(spec).baselines()[-1]
    measured = next((r for r in records if r.kind == plan.kind and r.status == "ok" and r.engine_config), None)
    if measured is not None:
        return served_engine_config(measured)[0], measured
    config = plan.candidate.applied_to(spec.engine.template())
    if not plan.speculative:
        config = config.model_copy(update=dict(
            speculative_algorithm=None, speculative_draft_model_path=None, speculative_num_steps=None,
            speculative_eagle_topk=None, speculative_num_draft_tokens=None))
    return config.model_dump(), None


def engine_command(config: dict[str, Any]) -> str:
    """The command that starts ``config``'s engine (secrets redacted; the port is an example)."""
    from serving.engine.command import build_command
    from serving.engine.config import EngineConfig

    return build_command(EngineConfig.model_validate(config), host="0.0.0.0", port=30000,
                         python="python").shell(redacted=True)


def _tracking_uri(results_dir: Path) -> str | None:
    """The sweep's MLflow store as its state file records it (what ``serve --mlflow-run`` needs), else None."""
    try:
        uri = json.loads((Path(results_dir) / STATE_FILE).read_text(encoding="utf-8")).get("tracking_uri")
    except (OSError, ValueError, AttributeError):
        return None
    return uri if isinstance(uri, str) and uri else None


def _stamp(records: list[TrialRecord], visits: list[dict[str, Any]]) -> dict[str, Any]:
    trials, rounds = len(records), len({v.get("round") for v in visits})
    return {"stamp": f"t{trials}-v{len(visits)}", "trials_recorded": trials, "confirmation_visits": len(visits),
            "confirmation_rounds": rounds, "written_at": utc_timestamp()}


def morning_texts(spec: SweepSpec, records: list[TrialRecord], *, results_dir: Path,
                  visits: list[dict[str, Any]] | None = None) -> dict[str, str]:
    """The set's three texts by file name (:data:`MORNING_FILES`), as of ``records`` (every trial
    recorded so far) and ``visits`` (the confirmation's, ``confirmation.jsonl``'s visit lines)."""
    from rich.console import Console

    from orchestrator.sweep.output.summary_report import summary_table

    visits = [v for v in visits or [] if "trial" in v]
    as_of = _stamp(records, visits)
    metric, level = spec.objective.metric, spec.objective_concurrency
    default_config, default = default_engine_config(spec, records)
    candidate = best_record(records)
    is_default = candidate is not None and default is not None and candidate.number == default.number
    finish = f"spectune sweep --finish {results_dir} --max-minutes 60"
    state = "confirming" if visits else "searching"
    lines = [f"as of {as_of['written_at']}: {as_of['trials_recorded']} trial(s) recorded"
             + (f", {as_of['confirmation_visits']} confirmation visit(s) in {as_of['confirmation_rounds']} round(s)"
                if visits else "") + f"; the sweep was still {state} (no verdict yet)",
             "best.yaml holds SGLang's default configuration until a verdict says otherwise"
             + (f" (trial {default.number}, {metric} {default.value:.4g} measured)"
                if default is not None and default.value is not None else " (not measured yet)")]
    candidate_doc: dict[str, Any] | None = None
    if candidate is not None:
        config, numbers_from = served_engine_config(candidate)
        command = engine_command(config)
        over = (candidate.value / default.value if default is not None and default.value else None)
        candidate_doc = {"trial": candidate.number, "label": candidate.label, "value": candidate.value,
                         "ci95_low": candidate.objective.ci95_low if candidate.objective else None,
                         "ci95_high": candidate.objective.ci95_high if candidate.objective else None,
                         "over_sglang_default": over, "confirmed": False, "is_sglang_default": is_default,
                         "engine_config": config,
                         "engine_command": command, "mlflow_run_id": candidate.mlflow_run_id}
        lines.append(f"unconfirmed candidate: trial {candidate.number} {candidate.label}, {metric} "
                     f"{candidate.value:.4g} at concurrency {level}"
                     + (": SGLang's default itself, the best measured so far (best.yaml holds it)" if is_default
                        else f" (x{over:.3f} SGLang's default, measured in the search minutes apart, not confirmed)"
                        if over is not None else " (measured in the search, not confirmed)"))
        lines.append(f"  its engine command: {command}")
        if numbers_from:
            lines.append(f"  {numbers_from}")
        tracking = _tracking_uri(results_dir)
        lines.append(f"  or serve it: spectune serve --mlflow-run {candidate.mlflow_run_id}"
                     + (f" --tracking-uri {tracking}" if tracking else "") if candidate.mlflow_run_id else "")
    else:
        lines.append("unconfirmed candidate: none (no complete ok trial yet)")
    lines.append(f"to end the search and confirm within an hour: {finish} (leave --max-minutes out: no "
                 "confirmation)")
    lines = [line for line in lines if line]
    counts: dict[str, int] = {}
    for r in records:
        counts[r.status] = counts.get(r.status, 0) + 1
    summary = {"interim": True, "as_of": as_of, "state": state, "metric": metric, "concurrency": level,
               "best_yaml": {"holds": "sglang_default", "trial": default.number if default is not None else None,
                             "engine_config": default_config},
               "candidate": candidate_doc, "trials": counts, "finish_command": finish, "lines": lines}
    console = Console(record=True, width=140, file=io.StringIO())
    console.print(summary_table(records, metric=metric, concurrency=level,
                                best_trial=default.number if default is not None else None))
    text = console.export_text() + "\n".join(lines) + "\n"
    header = [f"spectune sweep {spec.name}: the answer as of now ({metric} at concurrency {level}); the night is "
              "not over", f"{AS_OF_PREFIX}{as_of['stamp']} {as_of['written_at']}", *lines,
              f"serve it: spectune serve {results_dir / 'best.yaml'}"]
    best_yaml = best_yaml_text(engine_config=default_config, header_lines=header)
    return {"best.yaml": best_yaml, "summary.json": json.dumps(summary, indent=2, default=str) + "\n",
            "summary.txt": text}


def read_as_of(results_dir: Path) -> dict[str, str | None]:
    """Each file's ``as_of`` stamp (None where missing or unreadable): equal in a consistent set."""
    out: dict[str, str | None] = {}
    try:
        out["summary.json"] = json.loads((results_dir / "summary.json").read_text(encoding="utf-8"))["as_of"]["stamp"]
    except (OSError, ValueError, KeyError, TypeError):
        out["summary.json"] = None
    try:
        lines = (results_dir / "best.yaml").read_text(encoding="utf-8").splitlines()
        out["best.yaml"] = next((line[2 + len(AS_OF_PREFIX):].split()[0] for line in lines
                                 if line.startswith(f"# {AS_OF_PREFIX}")), None)
    except OSError:
        out["best.yaml"] = None
    return out


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _relink(path: Path, target: str) -> None:
    """Make ``path`` a link to ``target`` in one step (a new link renamed over whatever is there)."""
    if path.is_symlink() and os.readlink(path) == target:
        return
    tmp = path.with_name(f".{path.name}.link.tmp")
    tmp.unlink(missing_ok=True)
    os.symlink(target, tmp)
    os.replace(tmp, path)


def write_morning_files(spec: SweepSpec, records: list[TrialRecord], *, results_dir: Path,
                        visits: list[dict[str, Any]] | None = None) -> str:
    """Publish a new set (:func:`morning_texts`) in one atomic step; returns its stamp.

    The texts go into a new folder ``.morning-<n>`` (fsynced), the :data:`MORNING_LINK` link is
    renamed onto it, then the previous folder is removed. The results directory's ``best.yaml``,
    ``summary.json`` and ``summary.txt`` are links through ``morning``, so a reader, and a kill at
    any moment, sees one whole set.

    Raises:
        OSError: the set could not be written; the previous one stays published.
    """
    results_dir = Path(results_dir)
    texts = morning_texts(spec, records, results_dir=results_dir, visits=visits)
    link = results_dir / MORNING_LINK
    serial = 1 + max((int(p.name.rsplit("-", 1)[1]) for p in results_dir.glob(".morning-*")
                      if p.name.rsplit("-", 1)[1].isdigit()), default=0)
    folder = results_dir / f".morning-{serial}"
    folder.mkdir()
    for name, text in texts.items():
        with open(folder / name, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
    _fsync_dir(folder)
    _relink(link, folder.name)  # the one step that publishes the set
    for name in MORNING_FILES:
        _relink(results_dir / name, f"{MORNING_LINK}/{name}")
    _fsync_dir(results_dir)
    for stale in results_dir.glob(".morning-*"):  # the previous set, and any a kill left half-written
        if stale.name != folder.name:
            shutil.rmtree(stale, ignore_errors=True)
    return json.loads(texts["summary.json"])["as_of"]["stamp"]


def retire_morning_files(results_dir: Path) -> None:
    """Take the interim set away once the final files are written: links left where the final
    sweep wrote no file of that name (no valid best: no best.yaml), the link and its folders."""
    results_dir = Path(results_dir)
    for name in MORNING_FILES:
        path = results_dir / name
        if path.is_symlink():
            path.unlink()
    link = results_dir / MORNING_LINK
    if link.is_symlink():
        link.unlink()
    for folder in results_dir.glob(".morning-*"):
        shutil.rmtree(folder, ignore_errors=True)
