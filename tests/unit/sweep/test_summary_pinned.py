"""The whole summary of three fixed sweeps, pinned byte for byte: ``summary.json`` as written and
every line ``summary.txt`` and the console print (the table, the verdict lines, the per-load lines,
the adaptive schedule's and the "which to launch" line).

The sweeps (``tests/helpers/summary_cases.py``) between them reach every figure of the summary:
both baselines, the search's best against them, best.yaml's trial against them (the
confirmation's choice, SGLang's default, in one; the search's best in the others), NCCL effects
from matched pairs and unmatched ones (an infeasible trial counts, an early-stopped one does not),
per-level bests with intervals that decide and one too few repetitions give none for, a level a
trial never reached, a decided crossover, a schedule with a 0 step and a "which to launch" line,
counts and time shares; the third minimises a latency.

The pinned files were written from the code before the summary's figures moved into one module
(``orchestrator/sweep/output/figures.py``); the move is a refactor, so nothing in them may change. To
re-pin after a change meant to alter the summary:
``PYTHONPATH=tests:. python tests/unit/sweep/test_summary_pinned.py`` (then read the diff).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from orchestrator.spec import SweepSpec
from orchestrator.sweep.confirmation.confirm import Confirmation
from orchestrator.sweep.execution.finish import summary_report, summary_text
from orchestrator.sweep.records.results import TrialRecord

from helpers.summary_cases import cases

PINNED = Path(__file__).parent / "pinned"


def _render(spec: SweepSpec, records: list[TrialRecord], confirmation: Confirmation | None) -> tuple[str, str]:
    """``summary.json``'s text (as ``results.write_json_file`` writes it) and ``summary.txt``'s."""
    report = summary_report(spec, records, confirmation)
    text = summary_text(records, report, metric=spec.objective.metric, concurrency=spec.objective_concurrency)
    return json.dumps(dict(report), indent=2, default=str) + "\n", text


@pytest.mark.parametrize("case", ["confirmation_off", "confirmed_default", "latency_min"])
def test_the_summary_is_unchanged(case: str) -> None:
    summary_json, summary_txt = _render(*cases()[case])
    assert summary_json == (PINNED / f"{case}.summary.json").read_text(encoding="utf-8")
    assert summary_txt == (PINNED / f"{case}.summary.txt").read_text(encoding="utf-8")


def test_the_pinned_sweeps_reach_every_figure() -> None:
    """The cases are worth pinning: each part of the summary they are meant to reach is there."""
    confirmed = json.loads((PINNED / "confirmed_default.summary.json").read_text(encoding="utf-8"))
    off = json.loads((PINNED / "confirmation_off.summary.json").read_text(encoding="utf-8"))
    assert confirmed["best_trial"] == 2 and off["best_trial"] == 3
    assert {(e["variable"], e["value"], e["basis"]) for e in off["nccl_effects"]} == {
        ("NCCL_ALGO", "Ring", "matched"), ("NCCL_ALGO", "Tree", "unmatched"), ("NCCL_PROTO", "Simple", "unmatched")}
    assert off["crossover"]["concurrency"] == 32 and off["launch"] is not None
    assert 0 in [row["steps"] for row in off["adaptive_schedule"]["levels"]]
    words = "\n".join(off["lines"] + off["per_load_lines"])
    for phrase in ("within the noise of", "undecided against", "too few repetitions for an interval",
                   "over no speculation"):
        assert phrase in words, phrase
    assert off["counts"] == {"ok": 7, "infeasible": 1, "early_stopped": 1, "failed": 1}


if __name__ == "__main__":  # re-pin (see the module's docstring)
    PINNED.mkdir(exist_ok=True)
    for name, case in cases().items():
        summary_json, summary_txt = _render(*case)
        (PINNED / f"{name}.summary.json").write_text(summary_json, encoding="utf-8")
        (PINNED / f"{name}.summary.txt").write_text(summary_txt, encoding="utf-8")
        print(f"wrote {PINNED / name}.summary.json and .txt", file=sys.stderr)
