#!/usr/bin/env python3
"""Do two sweeps of one spec agree? Compare their verdicts and print JSON.

    python benchmarks/replication.py RUN1/summary.json RUN2/summary.json [--out FILE]

Each summary's ``verdict`` holds the confirmation's statements (``vs_sglang_default``,
``vs_no_speculation``), each ``{"kind", "ratio", "ci95_low", "ci95_high", "visits", "trial",
"label", "against_label"}``. Two runs *contradict* each other when, for the same pair of
configurations (by label), one says ``better`` and the other ``worse`` or ``equivalent``, or one
says ``worse`` and the other ``better`` or ``equivalent``: a decided statement the other run's
decided statement rules out. ``undecided`` contradicts nothing (it states the interval only). When
the runs chose different leaders, each statement is checked against the other run's confirmation
visits of the same two configurations where it has them (the per-visit values in its
``confirmation.visits``), so "A better than default" in one run and "A worse than default" in the
other is caught even when A led only one of them.

Exit status 0 when the runs agree, 1 when they contradict each other, 2 for unreadable input.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.sequential import judge  # noqa: E402

RULED_OUT = {"better": {"worse", "equivalent"}, "worse": {"better", "equivalent"}, "equivalent": {"better", "worse"}}


def _statements(summary: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """(label, against label) -> the statement, for every comparison the run's verdict made."""
    out = {}
    for name in ("vs_sglang_default", "vs_no_speculation"):
        verdict = (summary.get("verdict") or {}).get(name)
        if verdict and verdict.get("label") and verdict.get("against_label"):
            out[(verdict["label"], verdict["against_label"])] = verdict
    return out


def _pair_from_visits(summary: dict[str, Any], a: str, b: str, margin: float) -> dict[str, Any] | None:
    """The run's own paired comparison of configurations ``a`` and ``b`` (by label), from its visits."""
    confirmation = summary.get("confirmation") or {}
    trial = {c["label"]: c["trial"] for c in confirmation.get("contenders", [])}
    if a not in trial or b not in trial:
        return None
    rounds = confirmation.get("rounds", 0)

    def series(number: int) -> list[float | None]:
        values: list[float | None] = [None] * rounds
        for visit in confirmation.get("visits", []):
            if visit["trial"] == number and visit["status"] == "ok" and visit["round"] < rounds:
                values[visit["round"]] = visit["value"]
        return values

    diffs = [math.log(x / y) for x, y in zip(series(trial[a]), series(trial[b])) if x and y and x > 0 and y > 0]
    if not diffs:
        return None
    # one look at all its pairs (a fixed design at the verdict's 2.5% a side)
    look = judge(diffs, margin=margin, first=max(2, len(diffs)), last=max(2, len(diffs)))
    return {"kind": look.claim, "ratio": look.ratio, "ci95_low": look.low, "ci95_high": look.high,
            "visits": look.pairs, "label": a, "against_label": b}


def compare(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    checks = []
    for this, other, name in ((first, second, "run1"), (second, first, "run2")):
        for (a, b), statement in _statements(this).items():
            margin = statement.get("margin", 0.01)
            theirs = _statements(other).get((a, b)) or _pair_from_visits(other, a, b, margin)
            if theirs is None:
                continue
            contradicts = theirs["kind"] in RULED_OUT.get(statement["kind"], set())
            checks.append({"from": name, "comparison": f"{a} vs {b}", "says": statement["kind"],
                           "ratio": statement["ratio"], "interval": [statement["ci95_low"], statement["ci95_high"]],
                           "other_run_says": theirs["kind"], "other_ratio": theirs["ratio"],
                           "other_interval": [theirs["ci95_low"], theirs["ci95_high"]], "contradicts": contradicts})
    return {"checks": checks, "contradiction": any(c["contradicts"] for c in checks)}


def _brief(summary: dict[str, Any]) -> dict[str, Any]:
    verdict = summary.get("verdict") or {}
    return {
        "best_label": summary.get("best_label"),
        "vs_sglang_default": {k: (verdict.get("vs_sglang_default") or {}).get(k)
                              for k in ("kind", "label", "ratio", "ci95_low", "ci95_high", "visits")},
        "vs_no_speculation": {k: (verdict.get("vs_no_speculation") or {}).get(k)
                              for k in ("kind", "label", "ratio", "ci95_low", "ci95_high", "visits")},
        "confirmation_visits": verdict.get("visits"), "confirmation_wall_s": verdict.get("wall_s"),
        "sweep_wall_s": summary.get("wall_s"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first", type=Path)
    parser.add_argument("second", type=Path)
    parser.add_argument("--out", type=Path, help="Also write the JSON here.")
    args = parser.parse_args()
    try:
        first, second = (json.loads(p.read_text(encoding="utf-8")) for p in (args.first, args.second))
    except (OSError, ValueError) as exc:
        print(f"replication: cannot read the summaries: {exc}", file=sys.stderr)
        return 2
    result = {"run1": {"summary": str(args.first), **_brief(first)},
              "run2": {"summary": str(args.second), **_brief(second)}, **compare(first, second)}
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    return 1 if result["contradiction"] else 0


if __name__ == "__main__":
    sys.exit(main())
