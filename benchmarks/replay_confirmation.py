"""Replay a sweep's confirmation from its recorded visits: the product's own ``run_confirmation``
over ``trials.jsonl`` and ``confirmation.jsonl``, with the spec as it is now (or another margin).

What it is for: a confirmation measured on a lent GPU cannot be run again at will. Its visits
are recorded, and the verdict is a function of them, the spec and the margin, so replaying them
shows what the current rules say about the same measurements (a changed ``confirmation.margin:
auto``, say). A visit the record lacks ends the replay before that round (never invented).

JSON goes to stdout::

    python benchmarks/replay_confirmation.py experiments/reference-gpu-replication.yaml \\
        docs/measurements/gpu-replication-h200x1-graphs/run1 [--margin 0.16]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.spec import SweepSpec  # noqa: E402
from orchestrator.sweep.confirmation.confirm import run_confirmation  # noqa: E402
from orchestrator.sweep.confirmation.margin import confirmation_margin  # noqa: E402
from orchestrator.sweep.records.results import read_records  # noqa: E402


class MissingVisit(Exception):
    """The record ends before this visit: the replay stops there."""


def replay(spec: SweepSpec, results: Path) -> dict[str, Any]:
    records = read_records(results / "trials.jsonl")
    visits = [json.loads(line) for line in (results / "confirmation.jsonl").read_text().splitlines() if line.strip()]
    lines: list[str] = []

    def visit(*_args: Any, **_kwargs: Any) -> Any:
        raise MissingVisit

    try:
        result = run_confirmation(spec, records, visit=visit, say=lines.append, done=visits)
    except MissingVisit:
        return {"margin": confirmation_margin(spec), "recorded_visits": len(visits),
                "verdict": None, "why": "the record ends before the next round: no verdict from what was measured",
                "progress": lines}
    assert result is not None
    return {"margin": confirmation_margin(spec), "recorded_visits": len(visits), "verdict": result.lines,
            "vs_sglang_default": result.vs_sglang_default, "infeasible": result.infeasible, "progress": lines}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("spec", type=Path)
    parser.add_argument("results", type=Path, help="a folder holding trials.jsonl and confirmation.jsonl")
    parser.add_argument("--margin", type=float, default=None, help="confirmation.margin instead of the spec's")
    args = parser.parse_args()
    spec = SweepSpec.from_yaml(args.spec)
    if args.margin is not None:
        spec = spec.model_copy(update={"confirmation": spec.confirmation.model_copy(update={"margin": args.margin})})
    print(json.dumps(replay(spec, args.results), indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
