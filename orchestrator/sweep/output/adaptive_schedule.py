"""SGLang's adaptive speculation schedule (``--speculative-adaptive-config``) from the per-load results.

Each measured level gets one pinned entry (key: the level, the first ``"1"``): the steps of the
best chain (top-k 1) configuration there, or 0 where no speculation is decidedly faster
(``figures.LevelFigures``). :func:`launch_advice` says which to launch, the schedule or best.yaml,
where they disagree. docs/design/sweep.md gives SGLang's file format and the reasoning.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from orchestrator.sweep.output.figures import LevelFigures, chain_steps, decidedly_above_one
from orchestrator.sweep.records.results import TrialRecord, write_json_file

__all__ = ["SCHEDULE_FILE", "adaptive_schedule", "launch_advice", "launch_line", "schedule_lines", "schedule_rows",
           "schedule_summary", "write_adaptive_schedule"]

SCHEDULE_FILE = "sglang_adaptive_spec.json"

SLOT_DEFAULTS: dict[str, float] = {"up_hysteresis": 0.0, "down_hysteresis": -0.25, "ceiling_coeff": 0}
"""SGLang's per-slot defaults (``AdaptiveStepSlot``), written out so the file reads on its own."""

GLOBAL_DEFAULTS: dict[str, float] = {"ema_alpha": 0.2, "update_interval": 5, "warmup_batches": 10}
"""SGLang's global defaults; with pinned slots the EMA never moves the steps."""


def schedule_rows(per_level: Sequence[LevelFigures]) -> list[dict[str, Any]]:
    """Per level with a chain configuration measured (``SweepFigures.levels``: its best chain trial):
    ``{"concurrency", "key", "steps", "trial", "label", "plain_faster"}``; ``steps`` 0 where no
    speculation is decidedly faster there."""
    rows: list[dict[str, Any]] = []
    for entry in per_level:
        best = entry.best_chain
        if best is None:
            continue
        plain_faster = decidedly_above_one(entry.plain_vs_best_chain)
        rows.append({"concurrency": entry.concurrency, "key": "1" if not rows else str(entry.concurrency),
                     "steps": 0 if plain_faster else chain_steps(best), "trial": best.number, "label": best.label,
                     "plain_faster": plain_faster})
    return rows


def _config(rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The file's content from ``schedule_rows``, or None: fewer than two levels with a chain
    configuration, or 0 steps everywhere (then the answer is no speculation, no schedule)."""
    if len(rows) < 2 or not any(row["steps"] for row in rows):
        return None
    config: dict[str, Any] = {row["key"]: {"candidate_steps": [row["steps"]], **SLOT_DEFAULTS} for row in rows}
    config.update(GLOBAL_DEFAULTS)
    return config


def adaptive_schedule(per_level: Sequence[LevelFigures]) -> dict[str, Any] | None:
    """The schedule file's content from the per-level figures, or None (see ``_config``)."""
    return _config(schedule_rows(per_level))


def schedule_summary(per_level: Sequence[LevelFigures], *, file_name: str = SCHEDULE_FILE) -> dict[str, Any] | None:
    """``summary.json``'s ``adaptive_schedule`` from the per-level figures (``SweepFigures.levels``):
    the file, its rows, the launch flags and what to know."""
    rows = schedule_rows(per_level)
    config = _config(rows)
    if config is None:
        return None
    steps = max(row["steps"] for row in rows)
    flags = (f"--speculative-adaptive --speculative-adaptive-config {file_name} --speculative-eagle-topk 1 "
             f"--speculative-num-steps {steps}")
    notes = [
        f"SGLang >= 0.5.13 reads it{' (a step of 0, no drafting, needs >= 0.5.14)' if any(r['steps'] == 0 for r in rows) else ''}",
        _capture_note([int(row["key"]) for row in rows]),
        "keys are running decode batch sizes per rank; the sweep measured client concurrency in a closed loop, "
        "where concurrency equals the running batch at steady state",
    ]
    return {"file": file_name, "config": config, "levels": rows, "flags": flags, "notes": notes}


def _on_default_grid(size: int) -> bool:
    """Whether SGLang captures ``size`` by default under speculation
    (``generate_decode_cuda_graph_batch_sizes``, sglang ``srt/arg_groups/cuda_graph_hook.py``)."""
    return (size <= 8 or (size <= 32 and size % 2 == 0) or (size <= 64 and size % 4 == 0)
            or (size <= 256 and size % 8 == 0) or (size >= 272 and size % 16 == 0))


def _capture_note(bounds: Sequence[int]) -> str:
    """The note that every boundary must be a captured decode CUDA-graph size (SGLang pads a batch
    before it looks up its range: ``_pad_to_cuda_graph_bs``), naming the boundaries that are not."""
    listed = " ".join(str(b) for b in bounds)
    why = "a batch is padded up to the next captured decode CUDA-graph size before its range is looked up"
    missing = [b for b in bounds if not _on_default_grid(b)]
    if not missing:
        return (f"{why}; every boundary ({listed}) is one of SGLang's default sizes under speculation (1-8, then "
                "every 2 to 32, 4 to 64, 8 to 256), up to the largest it captures (--cuda-graph-max-bs-decode)")
    return (f"{why}; {', '.join(str(b) for b in missing)} {'is' if len(missing) == 1 else 'are'} not among SGLang's default sizes under speculation, so "
            f"give --cuda-graph-bs-decode with every size to capture, {listed} among them (the list replaces "
            "the defaults)")


def write_adaptive_schedule(path: Path, config: dict[str, Any]) -> Path:
    """Write the schedule (atomically, indented JSON)."""
    return write_json_file(path, config)


def schedule_lines(summary: dict[str, Any]) -> list[str]:
    """What the console and ``summary.txt`` say of the schedule."""
    steps = ", ".join(f"{row['steps']} from {row['key']}" for row in summary["levels"])
    return [f"  SGLang adaptive schedule (steps by batch size: {steps}): {summary['file']}",
            f"    launch with: {summary['flags']}"] + [f"    {note}" for note in summary["notes"]]


def _steps_as_run(record: TrialRecord) -> int | None:
    """The steps a schedule entry would need to be ``record``: 0 for no speculation, a chain's
    ``num_steps`` (SGLang's auto choice resolved), None for a tree configuration (no entry is)."""
    return 0 if record.params.get("speculative") == "off" else chain_steps(record)


def launch_advice(summary: dict[str, Any] | None, best: TrialRecord | None, *, objective_level: int,
                  confirmed_why: str | None) -> dict[str, Any] | None:
    """``summary.json``'s ``launch``: where the schedule (``summary``, from :func:`schedule_summary`)
    and best.yaml (``best``) disagree, which to launch for which traffic and why; None where there is
    no schedule or no best.yaml, or where every entry of the schedule is best.yaml's steps.

    Args:
        confirmed_why: Where the confirmation ran, why best.yaml holds its trial, in words
            (``finish.best_yaml_choice``: a choice or a fallback); None where it did not run (best.yaml
            is then the search's best: the confirmation was off or could not run).

    Returns:
        ``{"best_yaml_trial", "best_yaml_steps", "schedule_steps_at_objective", "objective_concurrency",
        "disagree_at", "text"}``; ``best_yaml_steps`` None for a tree configuration.
    """
    if summary is None or best is None:
        return None
    mine = _steps_as_run(best)
    rows = summary["levels"]
    disagree = [row["concurrency"] for row in rows if row["steps"] != mine]
    if not disagree:
        return None
    at_objective = next((row["steps"] for row in rows if row["concurrency"] == objective_level), None)
    span = f"concurrency {rows[0]['concurrency']}-{rows[-1]['concurrency']}"
    if confirmed_why is not None:
        why = confirmed_why
        source = "a search estimate the confirmation did not bear out"
        elsewhere = f"search estimates; the confirmation measured concurrency {objective_level} only"
    else:
        why = "the search's best there, no confirmation ran"
        source = "the best chain configuration's, from the same search estimates"
        elsewhere = "search estimates, like best.yaml"
    head = (f"which to launch: for traffic at concurrency {objective_level}, best.yaml (trial {best.number} "
            f"{best.label}; {why}); ")
    if at_objective is not None and objective_level in disagree:
        text = head + (f"{summary['file']}'s steps {at_objective} there are {source}, so launch it only for traffic "
                       f"that swings across {span}")
    else:
        others = ", ".join(f"{row['steps']} at {row['concurrency']}" for row in rows if row["concurrency"] in disagree)
        text = head + f"for traffic that swings across {span}, {summary['file']} (steps {others}: {elsewhere})"
    return {"best_yaml_trial": best.number, "best_yaml_steps": mine, "schedule_steps_at_objective": at_objective,
            "objective_concurrency": objective_level, "disagree_at": disagree, "text": text}


def launch_line(advice: dict[str, Any] | None) -> list[str]:
    """What the console and ``summary.txt`` say of :func:`launch_advice`: one line, or none."""
    return [] if advice is None else [f"  {advice['text']}"]
